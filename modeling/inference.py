"""A transformer tower outside training: how the served and evaluated models embed texts fast.

- **Batches without padding waste.** Texts are tokenised once, sorted by length and cut into batches of at
  most `batch` texts and `tokens` padded tokens, so a batch pads its texts to lengths that barely differ
  (a catalogue of titles from 3 to 32 word pieces). The vectors come back in the callers' order.
- **On a CPU, OpenVINO.** The tower is converted from its torch module when it is loaded (about 3 s; the
  graph comes from the checkpoint's tensors, so nothing else is stored or can go stale) and compiled by
  OpenVINO's CPU plugin, in bfloat16 where the CPU computes it natively (AVX512-BF16, AMX), else in float32,
  with one thread pool sized to the cores this process may use (`DSSM_THREADS` when a caller shares them:
  a Spark worker, the service). No weights are quantised, so a text's vector does not depend on the batch
  it came in; bfloat16 vectors are within 1e-5 of float32's in cosine (docs/studies/cpu-inference.md, which
  also has the int8 variants tried and not kept).
- **On a GPU, torch.** Float16 autocast over the same length-sorted batches (larger ones).
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Iterator

import numpy as np
import torch

from modeling.transformer import MiniLMEncoder, TokenBatch, padded

log = logging.getLogger(__name__)
CPU_BATCH, CPU_TOKENS = 64, 4096  # texts and padded word pieces per CPU batch
# a served batch (a few queries) is padded to a multiple of this many pieces: OpenVINO plans each new shape
# (1.5 ms a query of a shape seen before, 3.5 ms of varying ones); a catalogue's large batches are not
SMALL_BATCH, SMALL_MULTIPLE = 8, 8
GPU_BATCH, GPU_TOKENS = 1024, 65536
THREADS_ENV = "DSSM_THREADS"
PRECISION_ENV = "DSSM_CPU_PRECISION"  # f32 or bf16 to force one (comparisons); default: bf16 where native


def threads() -> int:
    """The threads one inference call may use: DSSM_THREADS, else the cores this process may run on."""
    from core.machine import usable_cpus

    value = os.environ.get(THREADS_ENV, "")
    return max(1, int(value)) if value.isdigit() else usable_cpus()


def cpu_precision(core) -> str:
    """bf16 where the CPU computes it natively (OpenVINO lists BF16 among its capabilities), else f32."""
    forced = os.environ.get(PRECISION_ENV, "")
    if forced in ("f32", "bf16"):
        return forced
    return "bf16" if "BF16" in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES") else "f32"


def precision_of(device: torch.device) -> str:
    """What a Tower on `device` computes in: float16 on a GPU; on a CPU bf16 or f32 (`cpu_precision`)."""
    if device.type == "cuda":
        return "float16"
    import openvino as ov

    return cpu_precision(ov.Core())


def length_batches(lengths: np.ndarray, batch: int, tokens: int) -> Iterator[np.ndarray]:
    """Indices of texts, shortest first, in batches of at most `batch` texts and `tokens` padded tokens."""
    order = np.argsort(lengths, kind="stable")
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and end - start < batch and (end - start + 1) * lengths[order[end]] <= tokens:
            end += 1
        yield order[start:end]
        start = end


class _Graph(torch.nn.Module):
    """(ids, mask) -> the tower's vectors: the signature of the exported graph."""

    def __init__(self, encoder: MiniLMEncoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(TokenBatch(ids, mask))


def compiled_tower(encoder: MiniLMEncoder, precision: str = ""):
    """The tower converted to OpenVINO and compiled for this CPU. Attention is converted as written (eager),
    which OpenVINO fuses; torch's fused SDPA would convert as a slower decomposition."""
    import openvino as ov

    config = encoder.bert.config
    attention = config._attn_implementation
    was_training = encoder.training
    encoder.eval()
    config._attn_implementation = "eager"
    example = (torch.ones((2, 8), dtype=torch.long), torch.ones((2, 8), dtype=torch.bool))
    from transformers.utils import logging as transformers_logging

    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # "loss_type=None ... unrecognized" as the tracer reads the config
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the tracer's notes on Python values it records as constants
            graph = ov.convert_model(_Graph(encoder), example_input=example, input=[ov.PartialShape([-1, -1])] * 2)
    finally:
        config._attn_implementation = attention
        encoder.train(was_training)
        transformers_logging.set_verbosity(verbosity)
    core = ov.Core()
    precision = precision or cpu_precision(core)
    settings = {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": threads()}
    settings["PERFORMANCE_HINT"] = "LATENCY"  # one stream: a call gets every thread
    compiled = core.compile_model(graph, "CPU", settings)
    log.debug("transformer tower compiled for the CPU: %s, %d threads", precision, threads())
    return compiled, precision


class Tower:
    """One transformer tower for inference: OpenVINO on a CPU, torch with float16 autocast on a GPU.
    `runtime="torch"` runs the GPU's path on any device (on a CPU in bfloat16: how CI tests it);
    `cpu_precision="f32"` keeps float32 on any CPU (the off-the-shelf MiniLM baseline: sentence-transformers'
    vectors, to float rounding)."""

    def __init__(self, encoder: MiniLMEncoder, device: torch.device, runtime: str = "auto", cpu_precision: str = ""):
        self.encoder, self.device, self.dim = encoder, device, encoder.dim
        self.request = None
        self.precision = "float16" if device.type == "cuda" else "bf16"
        if runtime == "openvino" or (runtime == "auto" and device.type == "cpu"):
            compiled, self.precision = compiled_tower(encoder, cpu_precision)
            self.request = compiled.create_infer_request()
            self._output = compiled.output(0)
            self._lock = threading.Lock()  # an infer request serves one call at a time

    def __call__(self, lengths: np.ndarray, flat: np.ndarray) -> np.ndarray:
        """The vectors of texts of `lengths` word pieces each, `flat` one text after another (float32)."""
        out = np.zeros((len(lengths), self.dim), np.float32)
        starts = np.concatenate([[0], np.cumsum(lengths)])
        cpu = self.request is not None
        for rows in length_batches(lengths, *((CPU_BATCH, CPU_TOKENS) if cpu else (GPU_BATCH, GPU_TOKENS))):
            pieces = np.concatenate([flat[starts[i] : starts[i + 1]] for i in rows])
            multiple = SMALL_MULTIPLE if cpu and len(rows) <= SMALL_BATCH else 1
            out[rows] = self._run(padded(lengths[rows], pieces, multiple))
        return out

    @torch.no_grad()
    def _run(self, batch: TokenBatch) -> np.ndarray:
        if self.request is not None:
            with self._lock:
                return self.request.infer([batch.ids.numpy(), batch.mask.numpy()])[self._output].copy()
        batch = batch.to(self.device, non_blocking=True)
        with torch.autocast(self.device.type, dtype=torch.float16 if self.device.type == "cuda" else torch.bfloat16):
            return self.encoder(batch).float().cpu().numpy()
