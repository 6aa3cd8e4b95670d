"""A simulated CUDA stream and the host that feeds it, for the CUDA timing protocols of the build
(forge_pack/evaluate/timing.py) and of the emitted package (templates/package/_bench.py) without a GPU."""

from __future__ import annotations


class SimGpu:
    """One CUDA stream and the host that feeds it, in simulated microseconds. Host work advances
    ``host``; a GPU op starts when both the GPU is free and the host has enqueued it; an event
    completes when the GPU reaches it. What the protocol measures is then exactly what a real
    event pair would: the kernel, plus any wait of the GPU for the host's launch."""

    def __init__(self, host_before_us: float, host_launch_us: float, kernel_us: float, flush_us: float = 20.0,
                 flush_host_us: float = 5.0, clock_rate: float = 1000.0):
        self.host = self.gpu = 0.0
        self.clock_rate = clock_rate  # the SM clock now, in cycles per µs
        self.flush_host_us = flush_host_us
        self.host_before_us, self.host_launch_us, self.kernel_us, self.flush_us = (
            host_before_us, host_launch_us, kernel_us, flush_us)
        self.spins: list[float] = []
        sim = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None
                self.timing = enable_timing is True

            def record(self):
                sim.host += 1.0
                self.t = sim.gpu = max(sim.gpu, sim.host)

            def elapsed_time(self, end):
                if not (self.timing and end.timing):  # as torch.cuda.Event.elapsed_time refuses
                    raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
                return (end.t - self.t) / 1000.0  # ms

        class Cuda:
            pass

        self.cuda = Cuda()
        self.cuda.Event = Event
        self.cuda.synchronize = lambda: setattr(self, "host", max(self.host, self.gpu))
        self.cuda._sleep = self._sleep
        self.cuda.current_device = lambda: 0

    def _sleep(self, cycles):
        self.host += 2.0
        self.spins.append(cycles / self.clock_rate)
        self.gpu = max(self.gpu, self.host) + cycles / self.clock_rate

    def _enqueue(self, host_us: float, gpu_us: float) -> None:
        self.host += host_us
        self.gpu = max(self.gpu, self.host) + gpu_us

    def before(self):
        self._enqueue(self.host_before_us, 1.0)  # the evaluator's input change and output refill

    def flush(self):
        self._enqueue(self.flush_host_us, self.flush_us)

    def call(self):
        self._enqueue(self.host_launch_us, self.kernel_us)  # the Python side, then the launch

    def clock(self) -> float:
        return self.host / 1e6
