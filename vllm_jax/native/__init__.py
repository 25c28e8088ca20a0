"""Native CPU kernels: C++ XLA FFI handlers the engine compiles on first use (native/build.py) and calls where
XLA:CPU's own code is far from the machine's floor (docs/architecture/06-model.md, "Quantized weights")."""
