#!/usr/bin/env bash
# Spark's GPU discovery script (spark.executor.resource.gpu.discoveryScript, spark.worker.resource.gpu.discoveryScript):
# prints the GPUs this machine has as Spark's ResourceInformation JSON, e.g. {"name": "gpu", "addresses": ["0","1"]}.
# The index stage embeds each task's titles on the GPU Spark assigned it (infra/README.md, "GPUs for the index stage").
set -euo pipefail
addresses=$( (nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null || true) | sed 's/[^0-9]//g' | sed '/^$/d' | sed 's/.*/"&"/' | paste -sd, -)
echo "{\"name\": \"gpu\", \"addresses\": [${addresses}]}"
