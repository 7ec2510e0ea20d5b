#!/usr/bin/env bash
# Run a command on a busy machine: one CPU hog per core at the lowest priority (nice 19), as a
# compile in the background would be, stopped when the command ends. `make test-busy` runs the
# suite this way; a test that compares wall times or waits on the clock fails here first.
set -euo pipefail
hogs=()
trap 'kill "${hogs[@]}" 2>/dev/null || true' EXIT
for _ in $(seq "$(nproc)"); do
  nice -n 19 sh -c 'while :; do :; done' &
  hogs+=($!)
done
"$@"
