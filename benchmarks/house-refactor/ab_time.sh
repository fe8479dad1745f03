#!/usr/bin/env bash
# before (5f73fc2, the layout before the house refactor) vs after (main), XLA's path in both
# (SPECJAX_CPU_KERNELS=0: the kernels are #32's change, not the refactor's), interleaved, 4 rounds
BEFORE=${BEFORE:?a checkout of 5f73fc2} AFTER=${AFTER:?a checkout of main}
PROMPT="def parse_args(argv):"
for round in 1 2 3 4; do
  for d in ar prompt-lookup draft-chain; do
    for dir in "$BEFORE" "$AFTER"; do
      line=$(cd $dir && SPECJAX_CPU_KERNELS=0 PYTHONPATH=$dir python -m specjax generate --prompt "$PROMPT" \
             --drafter $d --max-new-tokens 256 2>&1 >/dev/null | grep "new tokens")
      echo "$round $d $([ "$dir" = "$BEFORE" ] && echo before || echo after) $line"
    done
  done
done
