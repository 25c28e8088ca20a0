"""What the tests share, one job a module: tiny checkpoints (tiny_models), a live server and readers of its answers
(live_server, http_checks), the kernel oracle and its batches (attention_oracle, ragged_batches), transformers
parity (parity), the multi-device checks run in-process on the session's fake CPU devices (kernel_sharding_checks,
multidevice_checks, lora_tp_check, parallel_workload), and one process of the two-process test (multihost_process)."""
