#!/bin/bash
# one device run: the real `python -m sglang.launch_server` of SGLang 0.5.17 patched by sm120patch
# (sgl_kernel is a stand-in without kernels, .whl/stubs: the 1.2 GB wheel is not carried)
# (new recipes / the DSA recipe before 0a0b6b4) with a DeepSeek-V3.2 config, on this GPU
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1 || { tail -20 $OUT/pip.log; exit 1; }
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv | tee $OUT/gpu.txt
python3 -c "import torch, sys; print('torch', torch.__version__, 'cap', torch.cuda.get_device_capability(), 'python', sys.version.split()[0])" | tee -a $OUT/gpu.txt
mkdir -p /tmp/new /tmp/old
tar xJf .whl/sgl.tar.xz -C /tmp/new && tar xJf .whl/sgl.tar.xz -C /tmp/old
cp .whl/old_overrides.py /tmp/old/sglang/srt/arg_groups/overrides.py
sha256sum /tmp/new/sglang/srt/arg_groups/overrides.py /tmp/old/sglang/srt/arg_groups/overrides.py | tee -a $OUT/gpu.txt
port=31200
for t in new old; do
  for kv in auto fp8_e4m3; do
    port=$((port+1))
    log=$OUT/launch-$t-$kv.log
    PYTHONPATH=/tmp/$t:/tmp/site:$PWD/.whl/stubs PYTHONUNBUFFERED=1 timeout -s INT 100 python3 -m sglang.launch_server --model-path .whl/dsv32 \
      --skip-tokenizer-init --port $port --kv-cache-dtype $kv --load-format dummy > $log 2>&1
    echo "== $t kv=$kv rc=$? lines=$(wc -l < $log)"
    grep -n "sm120patch" $log | head -3
    grep -n -i "dsa\|Error" $log | head -4
    pkill -f sglang.launch_server; sleep 1
  done
done
