#!/usr/bin/env bash
# Side by side, same machine, same templated prompt, decode-only tok/s: llama.cpp's
# llama-speculative-simple (built from the same vendored source) against specdec, exact and
# --fast. The project's copy of the workplace's peer_side_by_side.sh, with specdec's own
# options as specdec now takes them (--draft only where a model drafts: `--draft X
# --no-draft` and `--draft X --drafter ngram` are refused as contradictions).
# Usage: scripts/peer_side_by_side.sh LLAMA_BIN_DIR SPECDEC DRAFT TARGET PROMPTS LINE TOKENS
#   PROMPTS: a JSONL prompt file (fields id, text); LINE: which line; TOKENS: -n for both
#   sides (a large one lets each answer end on its own). PEER_SPECS="" skips the peer;
#   SPECDEC_FLAGS overrides the specdec configurations (a '|'-separated list).
# Build the peer as the shared script says (cmake ... --target llama-speculative-simple).
set -u
BIN=$1 SPECDEC=$2 DRAFT=$3 TARGET=$4 P=$5 LINE=$6 N=$7
row=$(sed -n "${LINE}p" "$P")
id=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["id"])' "$row")
text=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["text"])' "$row")
tpl="$(printf '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n' "$text")"$'\n'
for spec in ${PEER_SPECS-ngram-simple ngram-map-k}; do
  out=$("$BIN/llama-speculative-simple" -m "$TARGET" -md "$DRAFT" --spec-type "$spec" -p "$tpl" -n "$N" -t 2 -td 2 --temp 0 -c 4096 --spec-draft-n-max 16 2>&1 </dev/null)
  echo "$id peer $spec: $(echo "$out" | grep -oE 'decoded +[0-9]+ tokens in +[0-9.]+ seconds, speed: +[0-9.]+ t/s' | tail -1 | sed -E 's/.*decoded +([0-9]+).*speed: +([0-9.]+).*/\2 tok\/s (\1 tokens)/') $(echo "$out" | grep -oE 'accept *= *[0-9.]+%' | tail -1)"
done
IFS='|' read -r -a configurations <<< "${SPECDEC_FLAGS-"--no-draft|--drafter ngram|--drafter combined --draft $DRAFT|--fast --drafter combined --draft $DRAFT"}"
for flags in "${configurations[@]}"; do
  # shellcheck disable=SC2086  # each configuration is a list of options
  j=$("$SPECDEC" run $flags --target "$TARGET" --temp 0 -n "$N" --json "$text" </dev/null 2>/dev/null)
  echo "$id specdec $flags: $(printf '%s' "$j" | python3 -c 'import json,sys
s=json.load(sys.stdin)["stats"]; g=s["generated_tokens"]; d=(g-1)/(s["seconds"]-s["first_token_seconds"])
print("%.1f tok/s decode-only (%d tokens, %.2f/pass, ttft %.2fs)" % (d, g, s["tokens_per_pass"], s["first_token_seconds"]))')"
done
