#!/usr/bin/env bash
# The CUDA path of pseudo-graph discovery (Eq. 15) at 1M and 10M nodes, D = 16, s = 100, as one
# script for a lent GPU machine (its python3 has torch with CUDA; faiss is not needed):
#     OUT=runs/cuda bash benchmarks/pseudo_graph_cuda.sh
# Writes one benchmarks/pseudo_graph.py JSON per case into $OUT. Results: docs/results/pseudo_graph_cuda*.json.
set -euo pipefail
OUT="${OUT:-runs/cuda}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
run() { name=$1; shift; echo "== $name"; "$PY" benchmarks/pseudo_graph.py --dim 16 --s 100 --device cuda \
    --skip-baseline --output "$OUT/$name.json" "$@" 2>"$OUT/$name.err" | grep -E '"(seconds|recall|backend|gpu_peak_allocated_mb|peak_rss_mb)"' || tail -5 "$OUT/$name.err"; }
run pg_cuda_1m_exact --nodes 1000000 --backend torch --recall-sample 1000
run pg_cuda_1m_ivf --nodes 1000000 --backend ivf --data clustered --recall-sample 1000
run pg_cuda_10m_auto --nodes 10000000 --backend auto --data clustered --recall-sample 500
