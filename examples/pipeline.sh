#!/usr/bin/env bash
# Calibrate a model, export it for TensorRT and OpenVINO, and stop at the first failure.
# Usage: examples/pipeline.sh MODEL.onnx IMAGE_DIR OUT_DIR [calibrate options, e.g. --size 640x640]
# (a model with dynamic height/width needs --size). Exit codes of qtool: 0 ok, 1 bad input or
# request, 2 bad command line, 3 internal error (a bug), 130/143 interrupted. Each step writes its
# output atomically, so a failed step leaves no file; this script exits with the failed step's code.
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 MODEL.onnx IMAGE_DIR OUT_DIR [calibrate options]" >&2
  exit 2
fi
model=$1 images=$2 out=$3
shift 3
mkdir -p "$out"
stem=$(basename "$model" .onnx)
calib="$out/$stem.calib.json"

# calibrate: the JSON summary on stdout is one document; warnings and errors go to stderr
rc=0
summary=$(qtool -q calibrate "$model" --images "$images" -o "$calib" --json "$@") || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "calibration failed (exit $rc)" >&2
  exit "$rc"
fi
echo "calibrated $(python3 -c 'import json,sys; print(json.load(sys.stdin)["tensors"])' <<< "$summary") tensors"

# TensorRT 10/11: a Q/DQ model (the build command, with --shapes for dynamic inputs, is the JSON summary's "build")
qtool -q export "$model" --calib "$calib" --target tensorrt --trt-version 10.3.0 -o "$out/$stem.trt.onnx" --json > "$out/trt.json"
# TensorRT 8.6: the calibration cache (its trtexec --calib line is in cache.json's "build")
qtool -q export "$model" --calib "$calib" --target tensorrt --trt-version 8.6.1 -o "$out/$stem.cache" --json > "$out/cache.json"
qtool -q export "$model" --calib "$calib" --target openvino -o "$out/$stem.openvino.onnx"

# gates: the Q/DQ model obeys TensorRT 10.3's parser rules, and the cache covers every activation
# tensor of the model (inspect exits 1 otherwise)
qtool inspect "$out/$stem.trt.onnx" --trt-version 10.3.0 --json > "$out/trt_rules.json"
qtool inspect "$out/$stem.cache" --model "$model" --json > "$out/coverage.json"
echo "done: $out"
