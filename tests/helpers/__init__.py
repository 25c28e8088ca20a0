"""What the tests share, one job a module: tiny checkpoints (tiny_models), a live server and readers of its answers
(live_server, http_checks), the kernel oracle and its batches (attention_oracle, ragged_batches), transformers
parity (parity), and the scripts the multi-device tests run in subprocesses (kernel_sharding_checks,
multidevice_checks, multihost_process, parallel_workload)."""
