"""GPUs through NVML: topology (NVLink islands, PCIe/NUMA levels) and health (XID events).

``xid`` is the pure policy (which XID makes a GPU degraded or failed); ``nvml`` is the only
module that touches ``pynvml``. No GPU, no driver or no library is a reported state, never a
crash: the agent keeps watching the cloud either way.
"""
