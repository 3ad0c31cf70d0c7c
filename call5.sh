export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
TORCH_CUDA_ARCH_LIST=9.0 FORCE_CUDA=1 MAX_JOBS=16 python3 setup.py build_ext --inplace > $OUT/build.log 2>&1 || { tail -50 $OUT/build.log; exit 1; }
for r in 1 2; do for w in 16 24 32; do
  timeout 80 python3 tools/benchmark_pipeline.py --seconds 2.5 --rounds 1 --workers "12,face=$w" --pipelines "orbbec,orbbec decode only" --workloads face --timeout 40 2>&1 | grep "face  " | sed "s/^/[w$w r$r] /"
done; done
timeout 70 python3 tools/dev/core_interrupts.py python3 tools/dev/loader_stage_probe.py --workload face --workers 24 --waits --per-worker --seconds 4 > $OUT/probe24.log 2>&1
grep -v Warn $OUT/probe24.log | sed -n 1,3p | cut -c1-250
timeout 260 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider tests/test_io.py tests/test_data.py -k "(cuda and not 2_31) or page_locked or started_decodes or never_started" > $OUT/sanitizer.log 2>&1
echo sanitizer rc $?; tail -3 $OUT/sanitizer.log; grep -c "ERROR SUMMARY: 0" $OUT/sanitizer.log; grep "ERROR SUMMARY" $OUT/sanitizer.log | sort | uniq -c
