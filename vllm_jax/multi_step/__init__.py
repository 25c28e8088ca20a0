"""Multi-step decoding's device side (vLLM's --num-scheduler-steps; docs/architecture/05-worker.md, "Several decode
steps per dispatch"): the chunk program that loops K decode tokens on the device, and the runner's dispatch and
finish of a chunk. Which requests a chunk takes is the scheduler's choice (scheduler/multi_step.py)."""
