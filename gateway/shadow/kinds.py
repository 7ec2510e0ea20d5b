"""The two kinds of shadow copy: to a candidate pool, and to the primary's own pool (the noise
floor). Apart from gateway/shadow/sample.py, which draws them, so what only reads a copy's kind
(the judge, the rollout guards, the shadow minutes) does not import the router to know it."""

CANDIDATE = "candidate"
NOISE = "noise"
