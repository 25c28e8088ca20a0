"""Pooling's device side: the pooler kernel, the pooling programs of a DeviceStep and the pooling runner."""
