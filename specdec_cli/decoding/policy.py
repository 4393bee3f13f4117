"""The planner's tuned constants, together: each with what it is for and the measurement
that set it, so that whoever changes one knows what to measure again (`specdec bench` on
the suite; for the costs and the agreement they rest on, `step_costs.py` and
`drafter_agreement.py`, measuring tools kept beside the repository). Grouped by the module
that reads them."""

# ---- costs.py: the decode cost table, its probe and its healing ----------------------------

# Every decode the engine times is a measurement: per batch size, the median of the most
# recent ones is that size's cost (a median, so a decode slowed by something else running
# moves nothing). Drafter steps likewise.
COST_WINDOW = 9
DRAFT_STEP_WINDOW = 15
# A measured size corrects its neighbours by at most this factor either way: no size is
# ever assumed free or hopeless because of one measurement elsewhere.
RATIO_LIMITS = (0.1, 10.0)
# serve --parallel: a request's rows share each pass with other requests', so n rows cost
# what they add to the pass (costs.SharedPassCosts). Never less than this share of a
# one-token decode per row: the table's neighbouring sizes differ by less than their noise
# (2 rows measured below 1 on the Zen 5), and a row priced at nothing would make every
# draft lose to a plain step on a price that is only noise.
MIN_ROW_SHARE = 0.05
MEASURED_SIZES = (1, 2, 4, 8, 16, 32)
# The sizes a cost table keeps: the probed ones and the largest verification (longest draft
# and the target's own token), which the probe leaves to the run (it would add a second or
# more to the probe; until measured it is extrapolated from 16 and 32, a little high).
TABLE_SIZES = (*MEASURED_SIZES, 64)

# A probe's checks. Repeated timings of one size may differ by this factor at most; a
# larger size may cost less than a smaller one by this fraction (kernel switches); n tokens
# may cost this much more than n separate one-token decodes (a batch never should).
PROBE_AGREEMENT = 1.5
PROBE_SHRINK = 0.15
PROBE_BATCH_SLACK = 1.25
PROBE_REPEATS = 2
# ... and any two timings may differ by this much whatever their ratio: the operating
# system's jitter, which only matters for models that decode in a millisecond or less.
PROBE_JITTER = 0.001


# ---- acceptance.py: how likely a draft token is kept ---------------------------------------

# A learned rate starts from its prior worth this many observations and forgets old ones
# at this rate per observation, so it follows the text as it changes (set by hand with the
# n-gram priors; a faster decay chased noise on the suite's 128-token answers).
RATE_PRIOR_WEIGHT = 4.0
RATE_DECAY = 0.97
# Model drafts' realised tokens per second over what their plans expected, a running mean
# (a Rate of ratios) that model plans are scaled by. A plan prices the drafter's steps and
# the verification, but not all that a round costs (the drafter catching up after a
# correction, held-back text, overheads) nor acceptance that its confidence misjudges:
# SmolLM2 drafting by text for Qwen on prose kept drafting at 0.77x of the target alone on
# the AVX2 machine before this factor; corrected by what rounds really gave, plans that do
# not pay stop. One round's ratio is taken within these limits (a round that keeps
# everything, or nothing, is mostly luck); the first guess, 1.0, weighs REALISM_WEIGHT
# rounds, and old rounds are forgotten at REALISM_DECAY.
REALISM_LIMITS = (0.25, 2.0)
REALISM_WEIGHT = 4.0
REALISM_DECAY = 0.9
CONFIDENCE_EDGES = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)
# N-gram matches are judged by their length, in these buckets (1, 2, 3, 4, 5-7, 8-11, 12+
# tokens): a match of 12 or more is a copy in progress, one of a few tokens often a chance hit.
NGRAM_LENGTH_EDGES = (2, 3, 4, 5, 8, 12)
# How often an n-gram's continuation starts right, by match-length bucket. Cautious, since
# each wrong guess costs a verification: edits reach these rates and more, prose and fresh
# code far less. Learned per answer.
NGRAM_FIRST_PRIORS = (0.2, 0.4, 0.6, 0.7, 0.75, 0.85, 0.9)
# How often each later token of an n-gram draft is kept, given the one before, by the same
# buckets. Learned per bucket too: a long match runs on (0.99 on edits), while a short one
# right after an edit is a chance hit elsewhere in the text whose continuation soon parts
# from the answer; one shared rate let two-token matches draft 20-32 tokens and lose them
# (1.9 s of 12.6 on a long edit).
NGRAM_NEXT_PRIORS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95)
# The same for drafts from earlier prompts and answers (history.py; matches of 4 tokens or
# more): what followed there is a guess about this answer's structure (the same keys, the
# same header) more than its content, so trusted a little less than prompt lookup at first.
HISTORY_FIRST_PRIORS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
HISTORY_NEXT_PRIORS = (0.5, 0.5, 0.6, 0.6, 0.7, 0.8, 0.9)
# The same for drafts from a prediction: text the user expects the answer to repeat, so
# trusted more from the start; learned per answer like the others.
PREDICTION_FIRST_PRIORS = (0.5, 0.65, 0.75, 0.85, 0.9)
# A model draft token's chance of being kept, by the drafter's confidence in it
# (CONFIDENCE_EDGES buckets), before this answer has shown any; SmolLM2 drafting by text for
# Qwen measured 0.17/0.49/0.74/0.79/0.90/0.92/0.98 on the suite (AVX2 machine), close.
MODEL_CONFIDENCE_PRIORS = (0.2, 0.4, 0.6, 0.75, 0.85, 0.92, 0.97)
# A model draft's first token kept; and each later one given the one before. SmolLM2 drafting
# by text for the Qwen target kept 76% of the later ones over the suite (one prompt per
# category, 96 tokens each, greedy); a by-confidence bucket's rate (0.92) had planned drafts
# that lost on prose.
MODEL_FIRST_PRIOR = 0.6
MODEL_FOLLOWING_PRIOR = 0.75
# Each later token of a prediction's draft, given the one before: the user said so.
PREDICTION_NEXT_PRIOR = 0.95
# Text a grammar forces next (constraint.forced_text), drafted in the target's tokens: the
# target writes it unless it spaces or tokenises it otherwise. 48 of 50 such tokens were
# kept on the structured bench's two extraction prompts (Qwen2.5-Coder 1.5B, greedy).
FORCED_FIRST_PRIOR = 0.95
FORCED_NEXT_PRIOR = 0.95


# ---- adaptive.py: the planner --------------------------------------------------------------

# A plan must promise this much more than the target alone's pace to be drafted: a plan
# that only breaks even loses to the noise of its own estimates.
PLAN_MARGIN = 1.02
# A kind of draft that does not pay is tried again after this many rounds, the wait
# doubling after each fruitless try up to the longest (ProbeSchedule); cost explorations
# start sooner, since a table probed on a busy machine stops all drafting until corrected.
TRY_FIRST_WAIT = 32
TRY_LONGEST_WAIT = 512
EXPLORE_FIRST_WAIT = 8
# An n-gram draft tried while n-gram drafts do not pay: short, since on CPU each extra
# token verified costs about 60% of a target step when it is wrong.
PROBE_TOKENS = 2
# A model draft tried while model drafts do not pay: at most this long. It is there to
# learn whether the drafter's first tokens are kept now; grown by the drafter's confidence
# alone it ran to 20-30 tokens on code, each a drafter step (half a target step on CPUs).
MODEL_PROBE_TOKENS = 4
MIN_PROBE_MATCH = 3
# A batch of tokens decoded to catch the drafter up costs about this fraction of as many
# single steps (llama.cpp batches them into one decode), on the CPUs it was measured on: the
# price until this machine's is known (costs.CatchUpPrice, probed and learned: 0.14-0.19 on
# the 2-core Xeon with AVX-512, 2026-12-07).
CATCH_UP_COST = 0.4
# A catch-up teaches the cost table its price per token only when it read at least this
# many: on a GPU a few tokens cost what a decode of their shape costs, little of it theirs,
# and the price that decides whether a model drafts at all is the prompt's.
CATCH_UP_LEARN_MIN = 16
# A catch-up is paid once and serves the model drafts of the rounds after it, so a round
# is charged its share: over the rounds the answer may have left, at about two tokens a
# round, at most this many. Charged whole, the drafter's prefill of the prompt (90 tokens:
# 0.45 s for SmolLM2, 1.4 s for the 0.5B drafter on the AVX2 machine) outweighed any one
# round's gain, and the planner drafted with a model only when a probe forced it. It is
# still paid whole, at once, so a planned model draft is only made where the answer could
# lose its whole catch-up within PROBE_BUDGET (below): an agent's 29-token turn after a
# tool's result, its 122-token prompt not yet read by SmolLM2, took 2.30 s against the
# target alone's 1.57 s where the plan drafted, 0.75 s of it in the drafter (Zen 5, bench).
CATCH_UP_ROUNDS = 32
# Decode sizes the planner tries now and then even where the cost table calls them too
# dear, so a table that overprices them (probed on a busy machine) is corrected instead of
# locking drafting off. A try drafts n - 1 tokens from the best source at hand: the
# prediction or an n-gram match of at least MIN_PROBE_MATCH tokens; failing those, when
# there is a draft model, a filler of the text's own last tokens (at most
# FILLER_EXPLORE_TOKENS): the try is there to time the verification, and drafting it with
# the model would add a drafter step per token (on CPUs half a target step) for drafts the
# planner has judged not to pay. The least measured size goes first.
EXPLORE_SIZES = (2, 4, 8, 16, 32, 64)
FILLER_EXPLORE_TOKENS = 7
# A try that moved its size's cost by more than this fraction found the table wrong: the
# next comes soon again. One that did not doubles the wait (ProbeSchedule).
EXPLORE_MOVED = 0.2
# Tries the plan says do not pay (a model probe; an exploration drafted from the text's own
# tokens) are made only where, should one win nothing, the answer would still run at
# 1 - PROBE_BUDGET of the target alone's pace or better: what drafting has saved so far
# (by the cost table's one-token step) plus this fraction of the time the answer has
# taken must cover what the try costs beyond a plain step (for a model probe, the drafter's
# catch-up too; for a planned model draft, its catch-up alone). On the AVX2 machine, SmolLM2
# drafting for Qwen: unbounded, one model probe's catch-up (the drafter reading prompt and
# answer, 0.46-0.62 s) and two or three fillers (0.2 s) cost 96-token prose and QA answers
# 5-12% of their time for nothing; the savings let predictable text (n-gram hits in
# structured answers) probe early, which is where a probe finds model drafts that pay.
PROBE_BUDGET = 0.03


# ---- modes.py: the drafting modes ----------------------------------------------------------

# --drafter fixed (the classic loop) drafts this many tokens every round unless --draft-max.
FIXED_DRAFT_LENGTH = 8
# Adaptive modes choose each round's length themselves; this only bounds it. Long n-gram
# drafts are what pay on CPU: with llama.cpp's kernels one decode of 32 tokens costs about
# 6.7 single-token decodes and one of 64 about 10.7 (a fifth less per token), so a copy in
# progress is verified 64 tokens at a time. 63 + 1 is exact mode's invariant batch limit.
ADAPTIVE_DRAFT_LIMIT = 63
