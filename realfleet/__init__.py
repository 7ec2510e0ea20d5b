"""The real fleet: llama.cpp engines serving a model the project trains, on one machine.

The simulator rehearses scale, drift and failure; this package is where decisions meet real
numerics (docs/real-fleet.md). Its parts, one concept each:

- `engine`: where the llama-server binary is (built by scripts/build-engine.sh) and how one is
  started;
- `corpus`: the generated facts and prose the model learns, and the labelled suite that says
  which answers are right;
- `tokenizer`: the byte-level BPE the model reads, written into its GGUF file;
- `train`: the model and its training on the CPU (torch: the `train` extra, never the gateway's);
- `weights`: GGUF files from the trained weights: f16 (reference), q8_0 (int8), and analog
  noise at a stated signal-to-noise ratio (the harmful CIM part);
- `embedding`: all-MiniLM-L6-v2 converted to GGUF, served as the fleet's embedding pool;
- `power`: a power exporter in DCGM's metric names, from each engine process's CPU time;
- `fleet`: the processes of `make real`, started and stopped together.

Nothing in `gateway` imports this package.
"""
