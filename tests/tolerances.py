"""The tolerances of the equivalence checks (N ranks vs 1 rank), derived from the arithmetic, not fitted to a machine.

Two runs of lab 05 with the same init and the same global batch compute the same exact values; they differ only in
rounding: the order in which sums are taken (each rank sums its own tokens, the ring reduce-scatter adds the ranks'
partial sums, micro-batches accumulate) and the kernels that compute each GEMM (OpenBLAS picks Haswell, SkylakeX,
Zen ... kernels by CPU and by OPENBLAS_CORETYPE, and blocks sums differently with THREADS). Every bound below holds
for any of those orders and kernels.

Rounding model (float32, round to nearest): unit roundoff u = 2^-24. A sum or dot product of k terms, in any order,
is off by at most lambda * sqrt(k) * u * sum|terms| with probability at least 1 - 2 exp(-lambda^2 / 2) (Higham and
Mary, "A new approach to probabilistic rounding error analysis", SISC 2019: the errors are independent and of mean
zero; the deterministic worst case is k * u, which no real run approaches). lambda = 8: 2 exp(-32) = 2.5e-14 per
sum, so over a million gradient elements and every variant of `make check` the chance of a false alarm is below
1e-6.

    python3 tests/tolerances.py gradients CONFIG_JSON TOKENS SEQ   per-tensor bound on max|g_a - g_b| / max|g_b|
    python3 tests/tolerances.py loss CONFIG_JSON TOKENS SEQ        relative bound on the first step's loss
    python3 tests/tolerances.py adamw LR STEPS                     absolute bound on parameters after STEPS steps
    python3 tests/tolerances.py drift GRADS_DIR TOKENS SEQ LR      absolute loss drift per AdamW step (derived)
    python3 tests/tolerances.py torch_bf16_loss CONFIG_JSON TOKENS SEQ  relative bound, a step's loss, MP=bf16 vs torch
    python3 tests/tolerances.py torch_bf16_drift OURS_GRADS TORCH_GRADS LR   loss drift per step, MP=bf16 vs torch

TOKENS is the number of target tokens in one optimizer step (global batch x SEQ x accumulation).
"""
import json
import math
import struct
import sys
from array import array

U = 2.0 ** -24
LAMBDA = 8.0
BETA1, BETA2 = 0.9, 0.999  # core/fsdp/optim.c adamw_default_config
WEIGHT_DECAY = 1e-2


def load_config(path):
    with open(path) as file:
        return json.load(file)


def forward_path(config, seq):
    """The dot products one value passes through from the embedding to the loss, by length: per layer RMSNorm's
    mean of squares (C), q/k/v projections (C), attention scores (head_dim), softmax normaliser (T), attention
    times V (T), o_proj (C), RMSNorm (C), gate/up (C), down (I); then the final norm (C), lm_head (C) and the
    cross-entropy's log-sum-exp over the vocabulary (V)."""
    C, I, V = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = C // config["num_attention_heads"]
    layer = [C, C, head_dim, seq, seq, C, C, C, I]
    return layer * config["num_hidden_layers"] + [C, C, V]


def backward_path(config, seq):
    """Backward's dot products on the way back to the embedding, by length: the cross-entropy gradient (V), lm_head's
    input gradient (V), the final norm (C); per layer down_proj's input gradient (C), gate/up's (2 I), RMSNorm (C),
    o_proj's (C), dP = dO V^T (head_dim), the softmax backward (T), dQ and dK (T each), q/k/v's input gradient
    (C + 2 kv_heads head_dim), RMSNorm (C)."""
    C, I, V = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = C // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim
    layer = [C, 2 * I, C, C, head_dim, seq, seq, seq, C + 2 * kv, C]
    return [V, V, C] + layer * config["num_hidden_layers"]


def gradient_tolerance(config, tokens, seq):
    """Per tensor: max|g_a - g_b| <= tol * max|g_b|.

    A gradient element is g = (1/n) sum_i t_i over the n = TOKENS target tokens of the step; each term t_i is the
    product of the chain of dot products from the loss back to the parameter (forward then backward path, D terms
    in all: their rounding errors are independent, so they add like one dot product of length D). Each run's g is
    then off by at most lambda u (sqrt(n) + sqrt(D)) * mean|t_i|, and two runs differ by at most twice that.
    mean|t_i| is measured against max|g| of the tensor: the per-token terms of the tensor's largest element add
    up at least like independent signs do (a random walk), so mean|t_i| <= sqrt(n) max|g|.

      tol = 2 lambda u (sqrt(n) + sqrt(D)) sqrt(n)

    For the tiny model (n = 2048 tokens, SEQ 128: D = 5,636 + 8,200) that is 7.0e-3: a planted bug that averages
    with the wrong count (sum for mean: a factor of N ranks), skips a unit's reduce-scatter or shifts a shard is
    off by O(1), more than 100x above it; the measured differences (about 1e-6) sit 1000x below it."""
    n = tokens
    D = sum(forward_path(config, seq)) + sum(backward_path(config, seq))
    return 2.0 * LAMBDA * U * (math.sqrt(n) + math.sqrt(D)) * math.sqrt(n)


def logit_tolerance(config, seq):
    """Per tensor of logits: max|z_a - z_b| <= tol * max|z_b|. A logit is the end of the forward path (D_f terms);
    its last dot product (lm_head, length C) may cancel like a random walk, so |terms| <= sqrt(C) max|z|.

      tol = 2 lambda u sqrt(D_f) sqrt(C)"""
    return 2.0 * LAMBDA * U * math.sqrt(sum(forward_path(config, seq))) * math.sqrt(config["hidden_size"])


def sum_of_positives_tolerance(count):
    """Two sums of the same `count` non-negative numbers in different orders (a mean of cross-entropies), relative:
    each is within (count - 1) u of the exact sum (Higham's deterministic bound; no cancellation), so
    tol = 2 (count - 1) u."""
    return 2.0 * (count - 1) * U


def loss_tolerance(config, tokens, seq):
    """The first step's loss, relative: both runs start from bit-identical parameters (the init depends only on
    seed, name and index), so only rounding separates them. The loss is the mean of n cross-entropies, each >= 0
    (no cancellation in the mean) and each the end of the forward path (D_f terms). A cross-entropy is
    log-sum-exp(z) - z_target; at initialisation the logits are small (|z| < ln V = the loss itself), so its
    absolute error is at most twice its relative one times the loss: factor 2.

      tol = 2 lambda u (sqrt(n) + sqrt(D_f)) * 2"""
    n = tokens
    D_forward = sum(forward_path(config, seq))
    return 2.0 * LAMBDA * U * (math.sqrt(n) + math.sqrt(D_forward)) * 2.0


def adamw_update_bound(step, beta1=BETA1, beta2=BETA2):
    """|m_hat / (sqrt(v_hat) + eps)| after `step` steps, for any gradients. m_t = (1 - b1) sum_s b1^(t-s) g_s and
    v_t = (1 - b2) sum_s b2^(t-s) g_s^2; by Cauchy-Schwarz |sum b1^(t-s) g_s| <= sqrt(sum (b1^2/b2)^k)
    sqrt(sum b2^(t-s) g_s^2), and the bias corrections multiply by sqrt(1 - b2^t) / (1 - b1^t). Step 1 gives 1."""
    series = sum((beta1 * beta1 / beta2) ** k for k in range(step))
    return ((1 - beta1) / math.sqrt(1 - beta2)) * math.sqrt(series) * math.sqrt(1 - beta2 ** step) / (1 - beta1 ** step)


def adamw_parameter_tolerance(lr, steps, largest_parameter=1.0):
    """Absolute bound on |p_a - p_b| after `steps` AdamW steps from the same parameters, whatever the gradients.
    AdamW amplifies rounding: a gradient element near eps (1e-8) that differs by 1e-10 moves the parameter by up
    to lr in one run and less in the other. So no rounding-sized bound holds for the parameters; what holds is
    p <- p (1 - lr wd) - lr u_t with |u_t| <= adamw_update_bound(t) on both sides: the runs' updates differ by at
    most 2 lr bound(t) per step, and weight decay only shrinks an old difference. Add the rounding of storing p
    (u |p| per step, both runs).

      tol = 2 lr sum_t bound(t) + 2 steps u max|p|

    This catches only gross errors (lr-sized); the gradient check is the sensitive one."""
    return 2.0 * lr * sum(adamw_update_bound(t) for t in range(1, steps + 1)) + 2.0 * steps * U * largest_parameter


def read_safetensors(path):
    """{name: array('f')} from an F32 safetensors file (what lab 05 writes for SAVE and GRADS)."""
    with open(path, "rb") as file:
        header_size = struct.unpack("<Q", file.read(8))[0]
        header = json.loads(file.read(header_size))
        data = file.read()
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] != "F32":
            raise ValueError(f"{path}: tensor {name} is {entry['dtype']}, expected F32")
        begin, end = entry["data_offsets"]
        values = array("f")
        values.frombytes(data[begin:end])
        tensors[name] = values
    return tensors


def later_loss_allowance(gradients_run, gradients_reference, lr):
    """How far the loss of step t > 1 may drift beyond rounding, per step already taken, absolute. After step 1 the
    parameters differ by the difference of the AdamW updates. To first order the loss moves by sum_i g_i dp_i, and
    for AdamW's update u = g / (|g| + eps) (one element) a gradient error dg changes it by
    |du| = eps |dg| / (|g| + eps)^2, so |g du| <= |dg| / 4 for every |g|: the elements AdamW amplifies are exactly
    those whose gradient is too small to move the loss. With the step-1 gradient differences measured (both runs'
    GRADS), and later steps' rounding of the same size:

      allowance = lr / 4 * sum_i |g_run,i - g_reference,i|      (per step taken)"""
    return lr / 4.0 * sum(abs(a - b) for name, g in gradients_reference.items()
                          for a, b in zip(gradients_run[name], g))


def derived_loss_drift(gradients, config, tokens, seq, lr):
    """later_loss_allowance when the other run's gradients are not at hand (PyTorch's, in train.sh's parity): every
    gradient element is taken as off by the whole bound, tol * max|g| of its tensor (from one run's GRADS). Far
    looser than the measured allowance (1e-2 of the loss per step on the tiny model), so it catches only a step that
    goes wrong as a whole; the tight checks are the pieces': HF parity of every gradient, AdamW parity.

      drift = lr / 4 * sum_tensors numel * tol * max|g|      (per step taken)"""
    tol = gradient_tolerance(config, tokens, seq)
    return lr / 4.0 * sum(len(g) * tol * max(abs(x) for x in g) for g in gradients.values())


# bfloat16 (8 significant bits): unit roundoff of round-to-nearest-even, what one cast or one bfloat16 add costs.
U_BF16 = 2.0 ** -8


def bf16_sum_over_ranks_l1(local_l1_sum, world):
    """Per tensor, an L1 bound on |G_N - G_1| from bfloat16 rounding alone, where G_N is the gradient N ranks reduce
    in bfloat16 (MP=bf16) and G_1 the one 1 rank computes on the same global batch, both from the same bfloat16
    weights. Let g_r be rank r's float32 local gradient and S = (1/N) sum_r g_r the exact global one (float32
    differences between the runs are the separate gradient_tolerance term). Per element, with u = 2^-8:
      1 rank:  G_1 = bf16(g), |G_1 - S| <= u |g|.
      N ranks: t_r = bf16(g_r), |t_r - g_r| <= u |g_r| <= u/(1-u) |t_r|; the ring adds N - 1 partial sums, each
               rounded to bfloat16 (comm.c, as c10::BFloat16's a + b): |ring - sum t_r| <= (N-1) u (1+u)^N sum|t_r|;
               the mean's scaling rounds once more: u |G_N|.
    With |G_N|, |g| <= (1+u)^(N+1) (1/N) sum_r |t_r| and A = sum over the tensor's elements of sum_r |t_r| (each
    rank's ||t_r||_1, summed: lab 05 writes it beside GRADS as local_grad_l1.json):
      ||G_N - G_1||_1 <= [(N-1) u (1+u)^N + u/(1-u) + 2 u (1+u)^(N+1)] A / N      (about (N+2) u ||G||_1)
    Deterministic (worst case), for any order the ring or gloo adds in. Gradient accumulation (ACC > 1) adds the
    same bound per micro-batch, which A already sums. With bfloat16 compute (core/kernels/layers_bf16.h) every
    activation is rounded too, but per token: 1 rank and N ranks compute each row alike (a row's float32 sums do not
    depend on how many rows a GEMM has), so g_r is still the float32 sum of the same per-token terms, and where a
    float32 order does differ the rounding flip it may cause transfers that difference unamplified in expectation
    (check_torch_bf16.py), inside the float32 term. The bound is unchanged; measured after the change, the largest
    difference / bound is 0.20 on 2 ranks and 0.17 on 4 (lab 07's check)."""
    u, n = U_BF16, world
    return ((n - 1) * u * (1 + u) ** n + u / (1 - u) + 2 * u * (1 + u) ** (n + 1)) * local_l1_sum / n


def bf16_forward_roundings(config):
    """The tensors torch's bfloat16 forward (HF Qwen2, eager attention, MixedPrecision(param_dtype=bfloat16)) rounds
    to bfloat16 on one value's way from the embedding to the logits, as core/kernels/layers_bf16.h lists them (and
    tests/check_torch_bf16.py checks on torch). Per layer: input_layernorm (x * rstd cast back, then times the weight:
    2), the q/k/v projection (1), RoPE (q cos, rotate_half(q) sin, their sum: 3), the scores q k^T and their scaling
    (2), softmax's float32 result cast back (1; adding the causal mask's 0 rounds nothing), probs times V (1), o_proj
    (1), the residual add (1), post_attention_layernorm (2), gate or up (1), SiLU (1), SiLU times up (1), down_proj (1),
    the residual add (1): 19. Then the final norm (2) and lm_head (1); the cross-entropy runs on logits.float()."""
    return 19 * config["num_hidden_layers"] + 3


def longest_sum(config, seq):
    """The most terms any float32 sum of the forward adds: a GEMM's inner dimension (hidden, intermediate, head_dim),
    attention's T keys, the vocabulary's log-sum-exp."""
    C = config["hidden_size"]
    return max(C, config["intermediate_size"], C // config["num_attention_heads"], seq, config["vocab_size"])


def bf16_activation_loss_tolerance(config, tokens):
    """Relative bound on what rounding every activation to bfloat16 does to one step's loss (lab 07: MP=bf16 against
    float32 on the same weights). Each of the R = bf16_forward_roundings roundings on a token's path gives every
    element of its tensor an independent relative error |eps| <= u = 2^-8 of mean zero (Higham and Mary's model), so
    the loss moves by dL = sum_k c_k eps_k, c_k = a_k dL/da_k, and by Hoeffding |dL| <= lambda u sqrt(sum_k c_k^2)
    except with probability 2 exp(-lambda^2 / 2). The assumption, as loss_tolerance's factor 2: a tensor's rounding
    moves token i's loss l_i by at most 2 l_i times its elements' relative error (sum over the tensor of c_k^2 <=
    (2 l_i / n)^2), and l_i <= 2 L at initialisation (logits near 0: every l_i near ln V). Over n tokens x R tensors:

      tol = 2 lambda u sqrt(R / n) x 2"""
    return 2.0 * LAMBDA * U_BF16 * math.sqrt(bf16_forward_roundings(config) / tokens) * 2.0


def bf16_reduction_l1(local_l1_sum, levels):
    """Per tensor, an L1 bound on |G_bf16 - G_fp32| where both reduce the same bfloat16 local gradients t_r (the same
    strategy and ranks, reduce_dtype bfloat16 vs float32: every local computation is the same, bit for bit) as a mean
    over ranks in `levels` rings, one after another: [N] for a reduce-scatter (or NO_SHARD's all-reduce) over N ranks,
    [S, R] for HYBRID_SHARD's reduce-scatter in shard groups of S, then its all-reduce across replicate groups of R.
    A ring of m bfloat16 values rounds each hop's sum (comm.c): |ring - sum x| <= (m - 1) u (1+u)^m sum |x|; its mean
    rounds once more, u |result|, and |result| <= (1+u)^(m+1) sum |x| / m. A level's inputs are the last level's
    outputs, whose L1 grows by at most (1+u)^(m+1) / m per level while the errors carry through the means (divided by
    the later levels' sizes). So with A = sum over ranks of ||t_r||_1 (local_grad_l1.json) and N = prod(levels):

      ||G_bf16 - S||_1 <= sum over levels k of [(m_k - 1) u (1+u)^(m_k) + u (1+u)^(m_k + 1)] g_k A / N,
      g_k = prod over levels before k of (1+u)^(m_j + 1)

    (S the exact mean; about (sum of the m_k) u A / N). The float32 reduction of the same values is off from S by the
    same expression with u = 2^-24: its sum is added, so the bound holds for the difference of the two runs.
    Deterministic, for any order the rings add in. A sum for a mean is off by about ||G||_1, a dropped level or a
    skipped replicate all-reduce by O(||G||_1) too."""
    def one(u):
        total, growth = 0.0, 1.0
        for m in levels:
            total += ((m - 1) * u * (1 + u) ** m + u * (1 + u) ** (m + 1)) * growth
            growth *= (1 + u) ** (m + 1)
        return total
    world = math.prod(levels)
    return (one(U_BF16) + one(U)) * local_l1_sum / world


def mixed_precision_loss_bound(step, rounding, gradient_l1_difference, lr, loss, config, tokens, seq):
    """|loss_MP(t) - loss_fp32(t)| for the same init and batches (lab 07). Four parts:
      - computing on bfloat16 weights: L(bf16(w)) - L(w) = g . (bf16(w) - w) to first order, at most
        r_t = sum_i |g_i| |w_i - bf16(w_i)| (the lab measures it each step on the master weights); the factor 2
        leaves room for the second-order term, which is below the first while |bf16(w) - w| <= 2^-8 |w| is as
        small as it is (an assumption, not a theorem: a loss flat to first order would break it);
      - computing in bfloat16: every op's output rounded (core/kernels/layers_bf16.h), bf16_activation_loss_tolerance x
        |loss|;
      - the trajectories: AdamW's updates from the two runs' gradients differ; later_loss_allowance's argument
        (|g du| <= |dg| / 4 per element) with the step-1 gradient difference D = sum |g_MP - g_fp32|:
        (t - 1) lr / 4 D;
      - float32 rounding of the loss itself: loss_tolerance x |loss|.
      bound_t = 2 r_t + bf16_activation_loss_tolerance |loss| + (t - 1) lr / 4 D + loss_tolerance |loss|"""
    return 2.0 * rounding + (step - 1) * lr / 4.0 * gradient_l1_difference + \
        (loss_tolerance(config, tokens, seq) + bf16_activation_loss_tolerance(config, tokens)) * abs(loss)


def torch_bf16_loss_tolerance(config, tokens, seq):
    """Relative bound on one step's loss from that step's own computation, fsdplab MP=bf16 vs torch FSDP with
    MixedPrecision(param_dtype=bfloat16), given the same weights. Both round the same tensors at the same places
    (core/kernels/layers_bf16.h mirrors torch op by op; tests/check_torch_bf16.py checks it against torch) from float32
    values that differ only in summation order, so they disagree where those float32 values fall on two sides of a
    rounding boundary ("flips"). Two parts:
      - the float32 disagreement itself: loss_tolerance, as the float32 parity;
      - flips. A float32 sum of K terms computed in two orders differs by at most rho |v|, rho = lambda u32 sqrt(K)
        (K the longest sum, longest_sum: no cancellation assumed), and with the boundary's position uniform the two
        round apart with probability <= rho |v| / (bfloat16 spacing) <= rho / u, by one spacing <= 2 u |v|: the relative
        change eta of that element has E eta^2 <= (2 u)^2 rho / u = 4 u rho. With bf16_activation_loss_tolerance's
        assumption (a tensor moves l_i by at most 2 l_i times its elements' relative change, l_i <= 2 L), the n R
        tensors' flips (independent, mean zero by symmetry) move the mean loss by at most, by Bernstein's inequality
        (variance 16 u rho R l^2 / n, each term <= 2 u 2 l / n):
          lambda sqrt(16 u rho R / n) 2 L + lambda^2 (4 u / (3 n)) 2 L

      tol = loss_tolerance + 2 (4 lambda sqrt(u rho R / n) + 4 lambda^2 u / (3 n))

    For the tiny model (R = 79, n = 2048, K = 352) that is 2.9e-3 of the loss (it was 0.2 while fsdplab kept float32
    activations: then every one of torch's roundings counted as an independent error). Later steps add the drift of
    torch_bf16_drift."""
    rho = LAMBDA * U * math.sqrt(longest_sum(config, seq))
    R, n, u = bf16_forward_roundings(config), tokens, U_BF16
    flips = 4.0 * LAMBDA * math.sqrt(u * rho * R / n) + 4.0 * LAMBDA ** 2 * u / (3.0 * n)
    return loss_tolerance(config, tokens, seq) + 2.0 * flips


def torch_bf16_drift(ours_dir, torch_dir, lr):
    """The loss drift per step taken, fsdplab MP=bf16 vs torch, from the step-1 gradients both wrote (lab 05's GRADS,
    torch_fsdp_train.py's --grads): D = sum |g_fsdplab - g_torch| over every element. As later_loss_allowance, the loss
    moves by g . du per element; AdamW's first update is u(g) = g / (|g| + eps), and for a finite gradient difference
    dg (bfloat16's flips, not infinitesimal: a small gradient's sign may differ between the runs) |g (u(g + dg) - u(g))|
    <= |dg| (the sup, approached when g + dg = -g), so

      drift = lr x D      (per step taken; 4 x later_loss_allowance's first-order lr / 4)

    Returns (drift, D, the gross bound D must be under): D comes from rounding only when both sides' gradients are
    right; twice the bound of one side's bfloat16 reduce error (bf16_sum_over_ranks_l1 from ours local_grad_l1.json)
    is far above what flips make and far below a wrong gradient (a sum for a mean is off by ||g||_1)."""
    ours = read_safetensors(f"{ours_dir}/model.safetensors")
    theirs = read_safetensors(f"{torch_dir}/model.safetensors")
    if set(ours) != set(theirs):
        raise ValueError(f"tensors differ: {sorted(set(ours) ^ set(theirs))}")
    with open(f"{ours_dir}/local_grad_l1.json") as file:
        local = json.load(file)
    difference = sum(abs(a - b) for name, g in theirs.items() for a, b in zip(ours[name], g))
    gross = 2.0 * sum(bf16_sum_over_ranks_l1(local["local_grad_l1"][name], local["world"]) for name in ours)
    return lr * difference, difference, gross


def main(argv):
    if len(argv) == 5 and argv[1] in ("gradients", "loss"):
        config, tokens, seq = load_config(argv[2]), int(argv[3]), int(argv[4])
        bound = gradient_tolerance if argv[1] == "gradients" else loss_tolerance
        print(f"{bound(config, tokens, seq):.6e}")
        return 0
    if len(argv) == 6 and argv[1] == "drift":
        grads_dir, tokens, seq, lr = argv[2], int(argv[3]), int(argv[4]), float(argv[5])
        config = load_config(f"{grads_dir}/config.json")
        gradients = read_safetensors(f"{grads_dir}/model.safetensors")
        print(f"{derived_loss_drift(gradients, config, tokens, seq, lr):.6e}")
        return 0
    if len(argv) == 5 and argv[1] == "torch_bf16_loss":
        print(f"{torch_bf16_loss_tolerance(load_config(argv[2]), int(argv[3]), int(argv[4])):.6e}")
        return 0
    if len(argv) == 5 and argv[1] == "torch_bf16_drift":
        drift, difference, gross = torch_bf16_drift(argv[2], argv[3], float(argv[4]))
        if difference > gross:
            print(f"step-1 gradients: sum |g_fsdplab - g_torch| = {difference:.4e} exceeds {gross:.4e}, twice the "
                  f"bfloat16 reduce's error bound: a gradient is wrong, not rounded", file=sys.stderr)
            return 1
        print(f"{drift:.6e}")
        print(f"step-1 gradients: sum |g_fsdplab - g_torch| = {difference:.4e} (gross bound {gross:.4e}); drift "
              f"lr x that = {drift:.4e} per step", file=sys.stderr)
        return 0
    if len(argv) == 4 and argv[1] == "adamw":
        print(f"{adamw_parameter_tolerance(float(argv[2]), int(argv[3])):.6e}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
