#!/usr/bin/env bash
# The small English->German pair (issue 12; specjax/assets/small_pair/TRAINING.md), stage by stage.
#
#   bash benchmarks/train_small_pair.sh            # from the repository root; runs what is not done yet
#   STAGES="target bleu" bash benchmarks/train_small_pair.sh   # only some stages
#
# Idempotent and resumable: a stage whose export ($EXPORTS/<name>/model.safetensors) exists is skipped; a stage
# that was interrupted resumes from its run directory when the script is run again (`specjax train` continues
# from RUN_DIR/state.msgpack; the same command with the same --steps keeps the same learning-rate schedule).
# Run directories and exports live OUTSIDE the git checkout ($RUNS, default /work/runs), so a checkout laid anew
# loses nothing; the exports are copied into the checkout ($SHIP) only by the last stage, "ship".
# Every training runs under `nice -n 19` (the machine is shared). Long stages: run the script itself with nohup:
#   nohup bash benchmarks/train_small_pair.sh >> /work/runs/small_pair.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-/work/runs}
EXPORTS=${EXPORTS:-$RUNS/small_pair}            # bfloat16 HF exports: target/, draft_reference/, draft_distilled/
SHIP=${SHIP:-specjax/assets/small_pair}          # where the shipped files go (stage "ship")
VOCAB=specjax/assets/default_pair/spiece.model   # the mini pair's 8k vocabulary, shared by both pairs
STAGES=${STAGES:-"target draft_reference draft_distilled bleu ship"}
# "target_more" (eleventh session on): the shipped target (step 2,250, test BLEU 23.2) trained on to TARGET_MORE_STEPS
# in $RUNS/small_target2 (a new cosine schedule over the whole run, entered at step 2,250; TRAINING.md says why);
# not in the default STAGES: run it by name, STAGES=target_more.
# "target_ls" (fourteenth session on): the target from scratch under a small-data recipe, dropout 0.3 + label
# smoothing 0.1 (the target_more run overfit Multi30k at dropout 0.1: TRAINING.md), in $RUNS/small_target3;
# run it by name, STAGES=target_ls.
# "target_tok" (seventeenth session on): the twelfth session's GPU recipe (4,096 target tokens a batch, peak 4e-4,
# dropout 0.1, bfloat16 activations) on the CPU, TARGET_TOK_STEPS long, in $RUNS/tok4096; the best test BLEU
# trained here (TRAINING.md, sixteenth and seventeenth sessions). Run it by name, STAGES=target_tok.
# "target_tok_ls" (nineteenth session on): target_tok with label smoothing 0.1, TARGET_TOK_LS_STEPS long, in
# $RUNS/tok_ls. Run it by name, STAGES=target_tok_ls.
# "draft_shallow" (eighteenth session on): the distilled draft with 2 decoder layers, the one shipped since;
# run it by name, STAGES=draft_shallow, after draft_ls.
SPECJAX=${SPECJAX:-specjax}
PY=${PY:-python}
# SIGINT stays deliverable under nohup (Ctrl-C / kill -INT saves state). glibc.malloc.hugetlb=1: glibc asks for
# transparent huge pages on the large buffers XLA allocates anew every step (allocations above 32 MB are
# mmap-ed fresh each time); a 4,096-token target step 1.10-1.18x faster (TRAINING.md, nineteenth session).
NICE=(env --default-signal=INT GLIBC_TUNABLES=glibc.malloc.hugetlb=1 nice -n 19)

# Stage sizes and schedules (specjax/assets/small_pair/TRAINING.md says why).
TARGET_STEPS=${TARGET_STEPS:-2250}               # 7.7 epochs of Multi30k (292 batches of 2048 tokens each); TRAINING.md says why not 2,500
DRAFT_REF_STEPS=${DRAFT_REF_STEPS:-1500}         # 5.1 epochs (the mini pair's: 2,500; cut for the session's time, TRAINING.md)
DRAFT_DISTILL_STEPS=${DRAFT_DISTILL_STEPS:-1000}  # the mini pair's: 2,000; cut for the session's time (TRAINING.md)
TARGET_MORE_STEPS=${TARGET_MORE_STEPS:-9000}     # ~31 epochs in all: test BLEU 30 needs far more than 7.7 epochs (TRAINING.md)
TARGET_TOK_STEPS=${TARGET_TOK_STEPS:-1300}       # 8.9 epochs of 146 batches; cut from 3,106 to fit one session (TRAINING.md)
TARGET_TOK_LS_STEPS=${TARGET_TOK_LS_STEPS:-2000}  # 13.7 epochs of 146 batches: fits one session at 4 s a step
TARGET_LS_STEPS=${TARGET_LS_STEPS:-8760}         # 30 epochs of 292 batches: the usual length of a dropout-0.3 Multi30k run
DROPOUT_LS=${DROPOUT_LS:-0.15}                   # 0.3 for steps 0-3,050: it underfit (TRAINING.md), 0.15 from there on

done_() { [ -f "$EXPORTS/$1/model.safetensors" ]; }
# A model already committed into $SHIP (the finished target, from the ninth session on) counts as done on a new
# machine too: it is copied back into $EXPORTS, so the later stages (DistillSpec's teacher) find it there.
for m in target draft_reference draft_distilled; do
  if [ -f "$SHIP/$m/model.safetensors" ] && ! done_ "$m"; then mkdir -p "$EXPORTS"; cp -r "$SHIP/$m" "$EXPORTS/$m"; fi
done
want() { [[ " $STAGES " == *" $1 "* ]]; }
log() { echo "[$(date '+%F %T')] $*"; }

# The portable resume point of the target (committed between sessions: a machine and its $RUNS may not come
# back): the bfloat16 parameters at some step, as a Hugging Face export, and that step in its STEP file.
# Written by `bash benchmarks/train_small_pair.sh checkpoint` (stops the run with SIGINT, which saves
# state.msgpack, then exports it); used when $RUNS/small_target/state.msgpack is absent.
RESUME=${RESUME:-benchmarks/small_pair_resume/target}

RESUME_MORE=${RESUME_MORE:-benchmarks/small_pair_resume/target_more}  # the same for stage target_more
RESUME_LS=${RESUME_LS:-benchmarks/small_pair_resume/target_ls}        # the same for stage target_ls

# `checkpoint` stops the target run (SIGINT saves state.msgpack) and exports its portable resume point;
# `checkpoint_more` / `checkpoint_ls` do the same for stages target_more / target_ls; `export_more` /
# `export_ls` export without stopping the run.
case "${1:-}" in
  checkpoint) run=$RUNS/small_target; dest=$RESUME ;;
  checkpoint_more|export_more) run=$RUNS/small_target2; dest=$RESUME_MORE ;;
  checkpoint_ls|export_ls) run=$RUNS/small_target3; dest=$RESUME_LS ;;
  *) run= ;;
esac
if [ -n "$run" ]; then
  pid=$(pgrep -f "specjax train --run-dir $run " || true)
  if [ -n "$pid" ] && [[ "$1" != export_* ]]; then
    kill -INT $pid; while kill -0 $pid 2>/dev/null; do sleep 2; done
  fi
  "$PY" benchmarks/export_run.py "$run" "$dest" --vocab "$VOCAB"
  log "$1: $dest holds step $(cat "$dest/STEP")"
  exit 0
fi

if want target; then
  if done_ target; then log "target: $EXPORTS/target exists, skipped"; else
    resume=()
    if [ ! -f "$RUNS/small_target/state.msgpack" ] && [ -f "$RESUME/STEP" ]; then
      resume=(--init-from "$RESUME" --start-step "$(cat "$RESUME/STEP")")
      log "target: no state.msgpack; continuing from the portable resume point (step $(cat "$RESUME/STEP"))"
    fi
    log "target: training (resumes from $RUNS/small_target)"
    "${NICE[@]}" "$SPECJAX" train --run-dir "$RUNS/small_target" --model small-target --vocab "$VOCAB" \
      --steps "$TARGET_STEPS" --tokens-per-batch 2048 --learning-rate 5e-4 --warmup-steps 300 --seed 0 \
      --dropout 0.1 --compute-dtype bfloat16 --snapshot-every 250 --save-every 50 "${resume[@]}" \
      --export "$EXPORTS/target" --export-dtype bfloat16
  fi
fi

if want target_more; then
  if done_ target_more; then log "target_more: $EXPORTS/target_more exists, skipped"; else
    resume=()
    if [ ! -f "$RUNS/small_target2/state.msgpack" ]; then
      if [ -f "$RESUME_MORE/STEP" ]; then
        resume=(--init-from "$RESUME_MORE" --start-step "$(cat "$RESUME_MORE/STEP")")
      else
        resume=(--init-from "$SHIP/target" --start-step 2250)   # the shipped target: the end of stage "target"
      fi
      log "target_more: no state.msgpack; continuing from ${resume[1]} at step ${resume[3]}"
    fi
    log "target_more: training to step $TARGET_MORE_STEPS (resumes from $RUNS/small_target2)"
    "${NICE[@]}" "$SPECJAX" train --run-dir "$RUNS/small_target2" --model small-target --vocab "$VOCAB" \
      --steps "$TARGET_MORE_STEPS" --tokens-per-batch 2048 --learning-rate 5e-4 --warmup-steps 300 --seed 0 \
      --dropout 0.1 --compute-dtype bfloat16 --snapshot-every 250 --save-every 50 "${resume[@]}" \
      --export "$EXPORTS/target_more" --export-dtype bfloat16
  fi
fi

if want target_ls; then
  if done_ target_ls; then log "target_ls: $EXPORTS/target_ls exists, skipped"; else
    resume=()
    if [ ! -f "$RUNS/small_target3/state.msgpack" ] && [ -f "$RESUME_LS/STEP" ]; then
      resume=(--init-from "$RESUME_LS" --start-step "$(cat "$RESUME_LS/STEP")")
      log "target_ls: no state.msgpack; continuing from the portable resume point (step $(cat "$RESUME_LS/STEP"))"
    fi
    log "target_ls: training to step $TARGET_LS_STEPS (resumes from $RUNS/small_target3)"
    "${NICE[@]}" "$SPECJAX" train --run-dir "$RUNS/small_target3" --model small-target --vocab "$VOCAB" \
      --steps "$TARGET_LS_STEPS" --tokens-per-batch 2048 --learning-rate 5e-4 --warmup-steps 400 --seed 0 \
      --dropout "$DROPOUT_LS" --label-smoothing 0.1 --compute-dtype bfloat16 --snapshot-every 250 --save-every 50 \
      "${resume[@]}" --export "$EXPORTS/target_ls" --export-dtype bfloat16
  fi
fi

# The 4,096-token recipe (peak 4e-4, warmup 300, dropout 0.1, bfloat16 activations), shared by target_tok and
# target_tok_ls: tok4096 EXPORT_NAME RUN_SUBDIR STEPS SNAPSHOT_EVERY SAVE_EVERY [more specjax train flags].
tok4096() {
  local name=$1 run=$RUNS/$2 steps=$3 snapshot=$4 save=$5; shift 5
  if done_ "$name"; then log "$name: $EXPORTS/$name exists, skipped"; return; fi
  log "$name: training to step $steps (resumes from $run)"
  "${NICE[@]}" "$SPECJAX" train --run-dir "$run" --model small-target --vocab "$VOCAB" \
    --steps "$steps" --tokens-per-batch 4096 --learning-rate 4e-4 --warmup-steps 300 --seed 0 \
    --dropout 0.1 --compute-dtype bfloat16 --snapshot-every "$snapshot" --save-every "$save" "$@" \
    --export "$EXPORTS/$name" --export-dtype bfloat16
}
if want target_tok; then tok4096 target_tok tok4096 "$TARGET_TOK_STEPS" 100 100; fi
if want target_tok_ls; then tok4096 target_tok_ls tok_ls "$TARGET_TOK_LS_STEPS" 125 50 --label-smoothing 0.1; fi

if want draft_ls; then
  # The distilled draft again, for the target of stage target_ls (a draft distilled from another target loses
  # α): DistillSpec from a 4-layer draft (DRAFT_LS_INIT, below), teacher $DRAFT_TEACHER (default: the averaged export of
  # stage average, AVERAGE_RUN=small_target3). Run it by name, STAGES=draft_ls, once the teacher is chosen.
  # DRAFT_LS_MAX_EXAMPLES: distil on the first N training pairs only (the teacher's greedy outputs, the costly
  # part, then take N/29,000 of the time; seventeenth session: 14,500). DRAFT_LS_INIT: the 4-decoder-layer
  # draft it starts from (default: the shipped reference draft; the seventeenth session started from the then
  # shipped 4-layer distilled draft, `git show 6ef0e25:specjax/assets/small_pair/draft_distilled/...`).
  teacher=${DRAFT_TEACHER:-$EXPORTS/target_avg}
  if done_ draft_ls; then log "draft_ls: exists, skipped"; else
    [ -f "$teacher/model.safetensors" ] || { log "draft_ls needs the teacher $teacher"; exit 1; }
    log "draft_ls: DistillSpec forward KL from $teacher (resumes from $RUNS/small_draft_ls)"
    "${NICE[@]}" "$SPECJAX" train --run-dir "$RUNS/small_draft_ls" --model small-draft --vocab "$VOCAB" \
      --objective distill --teacher "$teacher" --init-from "${DRAFT_LS_INIT:-$SHIP/draft_reference}" \
      ${DRAFT_LS_MAX_EXAMPLES:+--max-examples "$DRAFT_LS_MAX_EXAMPLES"} --steps "${DRAFT_LS_STEPS:-1500}" \
      --tokens-per-batch 2048 --learning-rate 5e-4 --warmup-steps 100 --seed 0 \
      --compute-dtype bfloat16 --snapshot-every 500 --save-every 100 --export "$EXPORTS/draft_ls" \
      --export-dtype bfloat16
  fi
fi

if want draft_shallow; then
  # The shipped distilled draft from the eighteenth session on: 2 decoder layers instead of 4 (a CPU draft step
  # costs per op, so per layer), started from the first and last decoder layers of a 4-layer draft distilled
  # for the same teacher (DRAFT_SHALLOW_FROM, default: stage draft_ls's export) and distilled on all 29,000
  # pairs for 2,000 steps at peak 7e-4 (1,500 more at peak 3e-4 moved α by less than its noise: TRAINING.md).
  # Run it by name, STAGES=draft_shallow (DRAFT_TEACHER as for draft_ls). Shipping it is by hand: its export
  # $EXPORTS/draft_shallow becomes $SHIP/draft_distilled (stage ship copies only the three original stages).
  teacher=${DRAFT_TEACHER:-$EXPORTS/target_avg}
  from=${DRAFT_SHALLOW_FROM:-$EXPORTS/draft_ls}
  if done_ draft_shallow; then log "draft_shallow: exists, skipped"; else
    [ -f "$teacher/model.safetensors" ] || { log "draft_shallow needs the teacher $teacher"; exit 1; }
    [ -f "$RUNS/draft_shallow_init/model.safetensors" ] || {
      [ -f "$from/model.safetensors" ] || { log "draft_shallow needs a 4-layer draft in $from"; exit 1; }
      "$PY" benchmarks/select_layers.py "$from" "$RUNS/draft_shallow_init" --decoder-layers 0 3; }
    log "draft_shallow: DistillSpec forward KL from $teacher, 2 decoder layers (resumes from $RUNS/small_draft_shallow)"
    "${NICE[@]}" "$SPECJAX" train --run-dir "$RUNS/small_draft_shallow" --model small-draft-shallow \
      --vocab "$VOCAB" --objective distill --teacher "$teacher" --init-from "$RUNS/draft_shallow_init" \
      --steps 2000 --tokens-per-batch 2048 --learning-rate 7e-4 --warmup-steps 100 --seed 0 \
      --compute-dtype bfloat16 --snapshot-every 250 --save-every 100 --export "$EXPORTS/draft_shallow" \
      --export-dtype bfloat16
  fi
fi

if want draft_reference; then
  if done_ draft_reference; then log "draft_reference: exists, skipped"; else
    log "draft_reference: cross-entropy on the references (resumes from $RUNS/small_draft_ref)"
    "${NICE[@]}" "$SPECJAX" train --run-dir "$RUNS/small_draft_ref" --model small-draft --vocab "$VOCAB" \
      --steps "$DRAFT_REF_STEPS" --tokens-per-batch 2048 --learning-rate 1e-3 --warmup-steps 400 --seed 0 \
      --dropout 0.1 --snapshot-every 500 --save-every 100 --export "$EXPORTS/draft_reference" --export-dtype bfloat16
  fi
fi

if want draft_distilled; then
  if done_ draft_distilled; then log "draft_distilled: exists, skipped"; else
    done_ target && done_ draft_reference || { log "draft_distilled needs the target and draft_reference exports"; exit 1; }
    # DistillSpec (Zhou et al. 2023): the target's greedy outputs for every training source (computed once,
    # cached in RUN_DIR/teacher_outputs.npz) and the forward KL to the target's distributions at every position.
    log "draft_distilled: DistillSpec forward KL from the target (resumes from $RUNS/small_draft_distill)"
    "${NICE[@]}" "$SPECJAX" train --run-dir "$RUNS/small_draft_distill" --model small-draft --vocab "$VOCAB" \
      --objective distill --teacher "$EXPORTS/target" --init-from "$EXPORTS/draft_reference" \
      --steps "$DRAFT_DISTILL_STEPS" --tokens-per-batch 2048 --learning-rate 5e-4 --warmup-steps 100 --seed 0 \
      --snapshot-every 500 --save-every 100 --export "$EXPORTS/draft_distilled" --export-dtype bfloat16
  fi
fi

if want average; then
  # Checkpoint averaging (thirteenth session on; TRAINING.md): the mean of the AVERAGE_LAST newest snapshots of
  # stage target_more (every 250 steps) as a bfloat16 export in $EXPORTS/target_avg, and its BLEU (val, test)
  # appended to $EXPORTS/bleu.txt. Measured at step 4,000: +0.9 validation BLEU over the newest snapshot alone.
  # Not in the default STAGES: run it by name, STAGES=average.
  # AVERAGE_RUN: the run directory whose snapshots are averaged (small_target2: stage target_more; small_target3:
  # stage target_ls).
  "$PY" benchmarks/average_snapshots.py "$EXPORTS/target_avg" --last "${AVERAGE_LAST:-4}" "$RUNS/${AVERAGE_RUN:-small_target2}" \
    --vocab "$VOCAB"
  for split in val test; do
    nice -n 19 "$PY" benchmarks/target_bleu.py "$EXPORTS/target_avg" "$split" | tee -a "$EXPORTS/bleu.txt"
  done
fi

if want bleu; then
  # Greedy BLEU (sacrebleu 13a) of the bfloat16 target export on Multi30k validation and test 2016; the goal is
  # test >= 30. Results are appended to $EXPORTS/bleu.txt (a stage that is re-run appends again).
  if done_ target; then
    for split in val test; do
      nice -n 19 "$PY" benchmarks/target_bleu.py "$EXPORTS/target" "$split" | tee -a "$EXPORTS/bleu.txt"
    done
  else log "bleu: no target export yet, skipped"; fi
fi

if want ship; then
  if done_ target && done_ draft_reference && done_ draft_distilled; then
    mkdir -p "$SHIP"
    for m in target draft_reference draft_distilled; do
      [ -f "$SHIP/$m/model.safetensors" ] || cp -r "$EXPORTS/$m" "$SHIP/$m"
    done
    cp "$VOCAB" "$SHIP/spiece.model"
    log "ship: $SHIP holds the three bfloat16 models and spiece.model"
  else log "ship: not every export is there yet, skipped"; fi
fi
