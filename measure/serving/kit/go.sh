#!/usr/bin/env bash
# GPU-machine side of the serving runs. usage: bash KIT/go.sh SECONDS
# Unpacks the staged vLLM once (its parts copied to /tmp/stage beforehand), writes a word-level tokenizer beside
# each config.json, then runs lanes 0 and 1 side by side (one server at a time on each GPU) and the 0,1 lane (TP 2)
# once both are done, stopping before SECONDS have passed (SERVING_ORDER=TAG,...: a machine of one GPU runs the
# servers named one after another on GPU 0 instead). Everything measured so far comes back as $OUT/res.tgz;
# a later call resumes where this one stopped.
set -u
T0=$(date +%s); LIMIT=${1:-560}; KIT=$(cd "$(dirname "$0")" && pwd); ROOT=$(pwd)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_ALLREDUCE_USE_SYMM_MEM=0
mkdir -p /tmp/res
if [[ ! -d /tmp/vsite ]]; then
  if [[ -f $KIT/stage.sha256 ]]; then  # the parts copied so far, in order, against the stage's checksum
    got=$(cat /tmp/stage/tpart.* | sha256sum | cut -d' ' -f1)
    [[ $got == "$(cat "$KIT/stage.sha256")" ]] || { echo "stage checksum mismatch: $(ls /tmp/stage)"; exit 3; }
  fi
  bash "$ROOT/.vllm-stage/run/unpack.sh" > /tmp/res/unpack.log 2>&1; echo "unpack rc=$? in $(( $(date +%s) - T0 )) s"
  grep -E "^(vllm|torch|triton|cuda|nccl|matmul|torch.compile)" /tmp/res/unpack.log
fi
for m in "$KIT"/models/*/; do [[ -f $m/tokenizer.json ]] || python3 "$ROOT/.vllm-stage/run/mktok.py" "$m" > /dev/null 2>&1 || echo "mktok failed: $m"; done
# the same tokenizer in a folder without config.json (plan.json's "tokenizer", where the model type would override it)
for m in "$KIT"/models/*/; do t=$KIT/tokenizers/$(basename "$m"); [[ -d $t ]] || { mkdir -p "$t"; cp "$m"/* "$t"/; rm -f "$t/config.json"; }; done
if [[ ! -f /tmp/res/env.txt ]]; then
  { date -u; nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
    PYTHONPATH=/tmp/vsite PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1 python3 -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'
  } > /tmp/res/env.txt 2>&1
  (PYTHONPATH=/tmp/vsite PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1 python3 -m vllm.entrypoints.cli.main bench serve --help > /tmp/res/bench-serve-help.txt 2>&1 &)
fi
cat /tmp/res/env.txt
DEADLINE=$((T0 + LIMIT - 20))
export PYTHONPATH=/tmp/vsite PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1
# a lane still inside a point at the limit is stopped (its servers run on, in their own sessions)
left() { local r=$(( T0 + LIMIT - 8 - $(date +%s) )); (( r < 1 )) && r=1; echo $r; }
if [[ -n ${SERVING_ORDER:-} ]]; then  # a machine of one GPU: the servers named, one after another, on GPU 0
  SERVING_GPUS=0 timeout -k 3 "$(left)" python3 "$KIT/lane.py" --lane one --deadline $DEADLINE > /tmp/res/lane-one.$T0.log 2>&1
elif [[ -z ${SERVING_LANE_ALONE:-} ]]; then  # SERVING_LANE_ALONE=1: only the 0,1 lane, without waiting for the others
  timeout -k 3 "$(left)" python3 "$KIT/lane.py" --lane 0 --deadline $DEADLINE > /tmp/res/lane-0.$T0.log 2>&1 &
  timeout -k 3 "$(left)" python3 "$KIT/lane.py" --lane 1 --deadline $DEADLINE > /tmp/res/lane-1.$T0.log 2>&1 &
  wait
fi
[[ -n ${SERVING_ORDER:-} ]] || timeout -k 3 "$(left)" python3 "$KIT/lane.py" --lane 0,1 --deadline $DEADLINE > /tmp/res/lane-01.$T0.log 2>&1
grep -h "^\[" /tmp/res/lane-*.$T0.log | sort | cut -c1-200
python3 "$KIT/lane.py" --summary
tar -czf "$OUT/res.tgz" -C /tmp res
ls -la "$OUT"; echo "go.sh took $(( $(date +%s) - T0 )) s"
