#!/usr/bin/env bash
# Every GPU check of issue 40 in one run, for a short window on a GPU machine: the GPU tier,
# the unit tier, the launch-phase benchmark on the ViT-B-16 presets, and pretraining.
#
# What that machine lacks goes in .whl/ beside this checkout, as wheels for its Python: flwr, Ray,
# open_clip and what they need (torch with CUDA is usually there already), and NVML's bindings
# for the benchmark's sampling (python -m pip download --no-deps -d .whl nvidia-ml-py); the
# script installs them into /tmp/site. Steps, in priority order:
#   bash tests/gpu/run_on_device.sh                  # all steps: gpu unit launch pretrain
#   bash tests/gpu/run_on_device.sh gpu unit         # some of them
# Each step's whole output goes to $OUT/<step>.log (OUT: the device tool's folder, else ./gpu-run),
# its status and seconds to $OUT/summary.txt; the benchmark's figures to $OUT/launch-*.json.
# STEP_TIMEOUT (seconds, default 420) bounds each step, so one hang does not take the window.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
out=${OUT:-gpu-run}
mkdir -p "$out"
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(gpu unit launch pretrain)

if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD" PATH="/tmp/site/bin:$PATH"
fi
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 FLWR_TELEMETRY_ENABLED=0
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available(), torch.cuda.device_count())' | tee "$out/machine.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$out/machine.txt" 2>&1
nproc >> "$out/machine.txt"

step() {
  local name=$1
  shift
  local started=$SECONDS
  echo "== $name: $*"
  timeout "${STEP_TIMEOUT:-420}" "$@" > "$out/$name.log" 2>&1
  local status=$?
  echo "$name: exit $status in $((SECONDS - started)) s" | tee -a "$out/summary.txt"
  tail -n 25 "$out/$name.log"
}

for name in "${steps[@]}"; do
  case "$name" in
    gpu) step gpu-tier python3 -m pytest -q -p no:cacheprovider -o addopts="-ra --durations=15" tests/gpu ;;
    unit) step unit-tier python3 -m pytest -q -p no:cacheprovider tests/unit ;;
    launch)
      step launch-sdfed python3 benchmarks/launch_phases.py --preset conf/sdfed-vitb16.yaml --gpus-per-client 0.25 \
        --rounds 5 --classes 100 --images-per-class 40 --out "$out/launch-sdfed.json"
      step launch-pep python3 benchmarks/launch_phases.py --preset conf/pep-fedpt-vitb16.yaml --gpus-per-client 0.1 \
        --rounds 5 --classes 100 --images-per-class 500 --out "$out/launch-pep.json"
      ;;
    pretrain)
      images=$(mktemp -d)
      python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import launch_phases as l; l.generate_images(__import__('pathlib').Path('$images'), 10, 1000, 32)"
      step pretrain python3 benchmarks/pretrain_clip.py --data "$images" --out "$(mktemp -d)/small-clip.pt" --epochs 3
      ;;
    *) echo "unknown step $name (gpu, unit, launch, pretrain)"; exit 2 ;;
  esac
done
cat "$out/summary.txt"
