"""Q2: the geometry of the run's hidden states (norms, the common mean, cosines between tasks, massive dimensions)
and what the saved head's logits are made of (W·mean(h), shared by every state, against W·(h − mean))."""
from __future__ import annotations

import numpy as np

from trinity.coordinator.roles import coordinator_text
from trinity.diagnosis.stored_run import StoredRun, banner, fmt


def q2(run: StoredRun) -> tuple[np.ndarray, np.ndarray]:
    """Print Q2; returns every stored state of the run's encoder (n, d) and their mean."""
    banner("Q2. Hidden-state geometry and what the head's logits are made of")
    keys = list(run.all_states)
    H = np.array([run.all_states[k] for k in keys], dtype=np.float64)
    task_of = {}
    for n in run.nodes.values():
        task_of.setdefault(n.key, n.task)
    norms = np.linalg.norm(H, axis=1)
    mu = H.mean(0)
    C = H - mu
    print(f"states: {len(H)} (all stored, this encoder); root states (parquet): {len(run.root_states)}")
    print(f"||h||: mean {norms.mean():.2f}, min {norms.min():.2f}, max {norms.max():.2f}; ||mean(h)|| = "
          f"{np.linalg.norm(mu):.2f}; ||h - mean||: mean {np.linalg.norm(C, axis=1).mean():.2f}")
    frac = (np.linalg.norm(mu) ** 2) / (norms ** 2).mean()
    print(f"fraction of E||h||^2 in the common mean: {frac:.3f}  (E||h-mean||^2 / E||h||^2 = {1 - frac:.3f})")
    A = np.abs(H)
    med = np.median(A, axis=1)
    top = np.sort(A, axis=1)[:, ::-1]
    print(f"per state: top-1 |h_i| / median |h_i| = {np.median(top[:, 0] / med):.1f} (median over states); "
          f"top-5 |h_i| = {fmt(np.median(top[:, :5], axis=0), 1)}; median |h_i| = {np.median(med):.3f}")
    dims = np.argsort(-np.abs(mu))[:6]
    print(f"largest |mean| dims: {[(int(i), round(float(mu[i]), 2)) for i in dims]}; their share of ||mean||^2: "
          f"{(mu[dims] ** 2).sum() / (mu ** 2).sum():.3f}; share of E||h||^2: "
          f"{(H[:, dims] ** 2).sum() / (H ** 2).sum():.3f}")
    top1 = int(np.argmax(np.abs(mu)))
    print(f"share of E||h−mean||² (the task/turn-specific part) in dim {top1} alone: "
          f"{(C[:, top1] ** 2).sum() / (C ** 2).sum():.3f}; in the 6 largest-mean dims: "
          f"{(C[:, dims] ** 2).sum() / (C ** 2).sum():.3f}")
    tails = sorted((float(run.all_states[n.key][top1]), coordinator_text(n.task, n.turns)[-14:])
                   for n in run.nodes.values() if n.state is not None)
    print(f"  dim {top1} vs the transcript's last characters (the feature is the penultimate token's state): "
          f"lowest {[(round(v, 1), t) for v, t in tails[:3]]}; highest {[(round(v, 1), t) for v, t in tails[-3:]]}")
    sd = C.std(0)
    print(f"per-dim std across states: median {np.median(sd):.3f}, max {sd.max():.3f} (dim {int(sd.argmax())}); "
          f"|mean_i|/std_i for the top |mean| dim: {abs(mu[dims[0]]) / max(sd[dims[0]], 1e-12):.1f}")

    def cos(X):
        Xn = X / np.linalg.norm(X, axis=1, keepdims=True)
        return Xn @ Xn.T

    # roots: one state per task
    rid = list(run.root_states)
    R = np.array([run.root_states[i] for i in rid])
    src = [run.tasks[i].source if i in run.tasks else i.split("/")[0] for i in rid]
    Cr = cos(R)
    Crc = cos(R - mu)
    iu = np.triu_indices(len(R), 1)
    same = np.array([src[a] == src[b] for a, b in zip(*iu)])
    print(f"root states ({len(R)} tasks): cosine between different tasks: mean {Cr[iu].mean():.3f}, min "
          f"{Cr[iu].min():.3f}; same benchmark {Cr[iu][same].mean():.3f} vs different benchmark "
          f"{Cr[iu][~same].mean():.3f}")
    print(f"  after subtracting the all-states mean: mean {Crc[iu].mean():.3f}; same benchmark "
          f"{Crc[iu][same].mean():.3f} vs different {Crc[iu][~same].mean():.3f}")
    # all states of different tasks
    tk = [task_of.get(k) for k in keys]
    ids = [t.id if t is not None else None for t in tk]
    Ca = cos(H)
    ia = np.triu_indices(len(H), 1)
    diff = np.array([ids[a] is not None and ids[b] is not None and ids[a] != ids[b] for a, b in zip(*ia)])
    samet = np.array([ids[a] is not None and ids[a] == ids[b] for a, b in zip(*ia)])
    print(f"all stored states: cosine, different tasks: mean {Ca[ia][diff].mean():.3f} (min {Ca[ia][diff].min():.3f}); "
          f"same task (different turns): mean {Ca[ia][samet].mean():.3f}")
    # decomposition of the saved head's logits
    W, L = run.W, run.L
    common = W @ mu
    dev = C @ W.T  # (n, L+3)

    def centred(z, lo, hi):
        return z[..., lo:hi] - z[..., lo:hi].mean(-1, keepdims=True)

    cm, cr = centred(common, 0, L), centred(common, L, L + 3)
    dm, dr = centred(dev, 0, L), centred(dev, L, L + 3)
    print("\nsaved head: z = W·mean(h) + W·(h − mean)  (logits centred within the model / role groups, since "
          "softmax ignores a shared shift)")
    print(f"  model logits: W·mean = {fmt(cm)}  (spread {np.ptp(cm):.3f}); W·(h−mean): std across states per "
          f"logit = {fmt(dm.std(0))}, mean |.| = {np.abs(dm).mean():.3f}")
    print(f"  role  logits: W·mean = {fmt(cr)}  (spread {np.ptp(cr):.3f}); W·(h−mean): std across states per "
          f"logit = {fmt(dr.std(0))}, mean |.| = {np.abs(dr).mean():.3f}")
    full = C + mu
    am_full = (full @ W.T)[:, :L].argmax(1)
    ar_full = (full @ W.T)[:, L:].argmax(1)
    print(f"  states whose model argmax equals that of W·mean alone: {(am_full == cm.argmax()).mean():.0%}; "
          f"role argmax: {(ar_full == cr.argmax()).mean():.0%}")
    print(f"  share of the logit variation (mean square, centred) from the common part: model "
          f"{(cm ** 2).sum() / ((cm ** 2).sum() + (dm ** 2).sum(1).mean()):.2f}, role "
          f"{(cr ** 2).sum() / ((cr ** 2).sum() + (dr ** 2).sum(1).mean()):.2f}")
    # the massive dims' share in the logits
    Wd = W[:, dims]
    print(f"  share of W·mean (per logit, centred model group) carried by the {len(dims)} largest-mean dims: "
          f"{fmt(centred(Wd @ mu[dims], 0, L))} of {fmt(cm)}")
    # what a fresh candidate (x0=0, sigma0) sees
    s0 = run.settings.evolve.sigma0
    print(f"\na fresh candidate W ~ N(0, sigma0^2={s0}^2): logit std = sigma0·||h|| ≈ {s0 * norms.mean():.3f}, of "
          f"which common sigma0·||mean|| ≈ {s0 * np.linalg.norm(mu):.3f} and task-specific sigma0·||h−mean|| ≈ "
          f"{s0 * np.linalg.norm(C, axis=1).mean():.3f}")
    # separability: can a linear head tell benchmarks apart? centred, standardised root states
    Rs = (R - R.mean(0)) / (R.std(0) + 1e-6)
    print(f"  root states standardised per dim (train+eval roots' mean/std): ||h_std|| ≈ "
          f"{np.linalg.norm(Rs, axis=1).mean():.1f}; cosine between tasks: same benchmark "
          f"{cos(Rs)[iu][same].mean():.3f} vs different {cos(Rs)[iu][~same].mean():.3f}")
    return H, mu
