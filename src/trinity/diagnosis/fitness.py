"""Q3 and Q4: what the saved head's policy is worth and how much of training's fitness was signal.

Q3: how far from uniform the saved head's softmaxes are; the exact expected accuracy and reward of its sampled
policy against the argmax policy and the zero head (every path of the stored trees, `StoredRun.expect`); the
saved-fitness episodes replayed by the loop with their own streams; how far the CMA mean moved against a pure-noise
random walk. Q4: per generation, the spread of the candidates' fitness and how much of it is correctness; the
per-episode noise and the tasks per generation a 0.1 difference needs; the exact expected fitness of candidates
drawn around the CMA mean (the signal) against the observed spread."""
from __future__ import annotations

import math
from collections import Counter, defaultdict

import numpy as np

from trinity.coordinator.episode import episode_rng, shaped_reward
from trinity.coordinator.head import softmax
from trinity.diagnosis.stored_run import StoredRun, banner, fmt
from trinity.evolve.loop import load_run_state, saved_fitness_episodes


def _or_nan(x: float | None) -> float:
    return math.nan if x is None else x


def q3(run: StoredRun, states: np.ndarray, mean_state: np.ndarray) -> tuple[np.ndarray, float]:
    """Print Q3 (`states`, `mean_state`: Q2's); returns the CMA mean and sigma of the run's optimiser state."""
    banner("Q3. Sampled vs argmax policy; how far the CMA mean moved")
    W, L = run.W, run.L
    nodes = [n for n in run.nodes.values() if n.state is not None and not n.terminal]
    Z = np.array([W @ n.state for n in nodes])
    PM, PR = softmax(Z[:, :L]), softmax(Z[:, L:])
    print(f"max softmax prob per state ({len(nodes)} states): model mean {PM.max(1).mean():.3f} (uniform "
          f"{1 / L:.3f}, max {PM.max():.3f}); role mean {PR.max(1).mean():.3f} (uniform 0.333, max {PR.max():.3f})")
    print(f"mean prob per model: { {run.names[i]: round(float(PM[:, i].mean()), 3) for i in range(L)} }; "
          f"per role: {dict(zip(['thinker', 'worker', 'verifier'], np.round(PR.mean(0), 3).tolist()))}")
    Ws = np.stack([W, np.zeros_like(W)])
    tasks = [t for t in run.tasks.values() if t.grader != "judge"]
    print("\nexact expectations by enumerating every path through the stored trees (unknown = mass reaching a "
          "never-asked edge / a missing state / an ungradeable answer)")
    print(f"{'task':40s} {'split':8s} {'saved head: E[acc] E[reward] unknown':38s} {'zero head (uniform)':24s} "
          f"argmax path -> outcome (correct)")
    agg = defaultdict(list)
    for t in tasks:
        e = run.expect(t, Ws)
        how, c, _, path, _ = run.play(t, W, None)
        unk = e["unknown"] + e["unknown_grade"]
        sp = run.split_of[t.id][:8]
        print(f"{t.id[:40]:40s} {sp:8s} {e['acc'][0]:.3f}  {e['reward'][0]:.3f}  {unk[0]:.3f}"
              f"                 {e['acc'][1]:.3f} {e['reward'][1]:.3f} {unk[1]:.3f}   "
              f"{'>'.join(m[:8] + '/' + r[:2] for m, r in path)} -> {how} ({c})")
        agg[sp].append((e, c))
    for sp, xs in agg.items():
        acc = np.mean([x[0]["acc"] for x in xs], axis=0)
        unk = np.mean([x[0]["unknown"] + x[0]["unknown_grade"] for x in xs], axis=0)
        rew = np.mean([x[0]["reward"] for x in xs], axis=0)
        bonus = np.mean([x[0]["bonus"] for x in xs], axis=0)
        first = np.mean([x[0]["first_answer"] for x in xs], axis=0)
        acc_end = np.mean([x[0]["accept"] for x in xs], axis=0)
        turns = np.mean([x[0]["turns"] for x in xs], axis=0)
        am = [x[1] for x in xs]
        print(f"  {sp:8s} sampled saved head: E[acc] in [{acc[0]:.3f}, {acc[0] + unk[0]:.3f}] (given known: "
              f"{acc[0] / max(1 - unk[0], 1e-9):.3f}), E[reward] known-part "
              f"{rew[0]:.3f}, E[bonus-penalty] {bonus[0]:.3f}, P(first answer ends)={first[0]:.3f}, P(ACCEPT ends)="
              f"{acc_end[0]:.3f}, E[turns]≥{turns[0]:.2f}, unknown {unk[0]:.3f} | zero head: E[acc] in "
              f"[{acc[1]:.3f}, {acc[1] + unk[1]:.3f}], P(first answer ends)={first[1]:.3f} | argmax: correct "
              f"{sum(x for x in am if x is not None):.0f}/{len(am)} (unknown {sum(x is None for x in am)})")
    # the saved-fitness episodes of the final generation, replayed with their own streams
    scoring = saved_fitness_episodes(run.settings, run.train)
    res = [run.play(t, run.W, episode_rng(run.settings.evolve.seed, "saved-fitness", k, t.id))
           for t, k in scoring]
    left = sum(x[0] in ("unexplored", "missing-state") for x in res)
    ungraded = [i for i, x in enumerate(res) if x[1] is None and x[0] not in ("unexplored", "missing-state")]
    if not left:
        # an ungraded (code) answer: its reward is the bonus alone if wrong; assume wrong, then check the sums
        rew0 = []
        for x in res:
            if x[2] is not None:
                rew0.append(x[2])
            else:
                x[4].correct = 0.0
                rew0.append(shaped_reward(x[4], run.max_turns, run.rw))
        acc0 = np.mean([x[1] or 0.0 for x in res])
        print(f"\nsaved-fitness episodes of the final mean replayed ({len(res)} sampled episodes, the run's own "
              f"streams; {len(ungraded)} code answers ungradeable here, taken as wrong): fitness {np.mean(rew0):.4f}, "
              f"accuracy {acc0:.3f} (checkpoint: {_or_nan(run.meta.saved_fitness):.4f}, "
              f"{_or_nan(run.meta.saved_accuracy):.3f})")
        print(f"  SE of that {len(rew0)}-episode figure from its own episodes: std/sqrt(n) = "
              f"{np.std(rew0, ddof=1) / math.sqrt(len(rew0)):.3f}; one correct episode more or less moves it by "
              f"{1 / len(rew0):.3f} (history: saved_accuracy {[round(h['saved_accuracy'], 3) for h in run.history]})")
    else:
        print(f"\nsaved-fitness replay: {left}/{len(res)} episodes leave the stored tree")
    for (t, k), x in zip(scoring, res):
        if x[1]:
            print(f"  correct: {t.id} sample {k}: {x[3]} -> {x[0]}")
    ends = Counter(x[0] for x in res)
    print(f"  endings: {dict(ends)}; argmax on the same {len(run.train)} training tasks: see the table above")
    # is the mean's preference along mean(h) larger than a random vector's?
    mh = mean_state / np.linalg.norm(mean_state)
    zs = [(W[i] @ mh) / (np.linalg.norm(W[i]) / math.sqrt(run.d)) for i in range(L + 3)]
    print(f"  saved head rows projected on mean(h)/||mean(h)||, in units of a random row's std "
          f"(||W_i||/sqrt(d)): {fmt(zs, 2)}  (models {run.names}, roles [th, wo, ve])")

    # movement of the mean
    st = load_run_state(run.root / "data/store/evolve_state.pkl")
    es = st.optimizer.es
    mean = np.asarray(es.mean, dtype=np.float64)
    n = mean.size
    sig = float(es.sigma)
    s0 = run.settings.evolve.sigma0
    mueff = float(es.sp.weights.mueff)
    gens = int(st.generation)
    rw = s0 * math.sqrt(n / mueff) * math.sqrt(gens)
    sv = getattr(es, "sigma_vec", None)
    scal = np.asarray(getattr(sv, "scaling", np.ones(n)) if sv is not None else np.ones(n), dtype=float)
    D = np.asarray(getattr(es, "D", np.ones(n)), dtype=float) * (scal if scal.size == n else 1)
    print(f"\nCMA state after {gens} generations: ||mean|| = {np.linalg.norm(mean):.3f} (= saved head: "
          f"{np.allclose(mean, run.params)}); sigma = {sig:.4f} (sigma0 {s0}); sigma·sqrt(n) = "
          f"{sig * math.sqrt(n):.3f}; one sample's distance sigma0·sqrt(n) = {s0 * math.sqrt(n):.3f}")
    print(f"  pure-noise random walk of the mean (no fitness signal): sigma0·sqrt(n/mueff)·sqrt(gens) = "
          f"{s0:.2f}·sqrt({n}/{mueff:.2f})·sqrt({gens}) = {rw:.3f}  -> observed/random-walk = "
          f"{np.linalg.norm(mean) / rw:.2f}")
    print(f"  diagonal scaling (sqrt of the covariance diagonal): min {D.min():.4f}, max {D.max():.4f} "
          f"(unadapted = 1)")
    mu = mean_state
    Wm = mean.reshape(L + 3, run.d)
    print(f"  mean head: logit std over states from its task-specific part: "
          f"{((states - mu) @ Wm.T).std(0).mean():.3f}; |W·mean(h)| per logit: {fmt(Wm @ mu)}")
    return mean, sig



def q4(run: StoredRun, n_heads: int, cma_mean: np.ndarray, cma_sigma: float) -> None:
    """Print Q4: fitness noise per generation, and the exact fitness spread of `n_heads` candidates drawn around
    the CMA mean (`cma_mean`, `cma_sigma`: Q3's)."""
    banner("Q4. Fitness noise")
    print(f"episodes table runs: {[(r[0], r[1]) for r in run.runs]}; analysing {run.run_id}")
    by_g = defaultdict(list)
    for g, c, tid, path, reward, correct in run.episodes:
        by_g[g].append((c, tid, reward, correct, path))
    pooled_within, pooled_solved = [], []
    rows = []
    for g in sorted(by_g):
        eps = by_g[g]
        tids = sorted({e[1] for e in eps})
        cands = sorted({e[0] for e in eps})
        R = np.array([[next(e[2] for e in eps if e[0] == c and e[1] == t) for t in tids] for c in cands])
        Cc = np.array([[next(e[3] for e in eps if e[0] == c and e[1] == t) for t in tids] for c in cands])
        fit = R.mean(1)
        fit_c = Cc.mean(1)
        bonus = (R - Cc).mean(1)
        within = R.var(0, ddof=1)  # per task, across candidates
        pooled_within += list(within)
        pooled_solved += [v for j, v in enumerate(within) if Cc[:, j].max() > 0]
        has_c = (Cc > 0).any(1)
        mu_sel = len(cands) // 2
        top = np.argsort(-fit)[:mu_sel]
        med = np.median(fit)
        above = fit - med
        single = [i for i in range(len(cands)) if abs(above[i]) > 0.25 and (Cc[i] > 0).sum() == 1]
        print(f"gen {g}: tasks {tids}; {len(cands)} candidates")
        print(f"  fitness mean {fit.mean():.3f}, std across candidates {fit.std(ddof=1):.3f} (min {fit.min():.3f}, "
              f"max {fit.max():.3f}); correctness part std {fit_c.std(ddof=1):.3f}, bonus−penalty part std "
              f"{bonus.std(ddof=1):.3f}")
        print(f"  correct rate per task across candidates: "
              f"{ {t[:30]: round(float(Cc[:, j].mean()), 3) for j, t in enumerate(tids)} }")
        print(f"  per-task reward std across candidates: {fmt(np.sqrt(within))}")
        print(f"  candidates with a correct episode: {int(has_c.sum())}; of the top {mu_sel} (CMA's parents): "
              f"{int(has_c[top].sum())}; candidates > 0.25 from the median because of exactly one correct "
              f"episode: {len(single)}/{len(cands)}; the best candidate's fitness {fit.max():.3f} = correct "
              f"{fit_c[np.argmax(fit)]:.3f} + bonus {bonus[np.argmax(fit)]:.3f}")
        if R.shape[1] == 2:
            r_ = np.corrcoef(R[:, 0], R[:, 1])[0, 1]
            print(f"  correlation across candidates of their rewards on the two tasks: r = {r_:.2f} (pure noise: "
                  f"0 ± {1 / math.sqrt(len(cands) - 1):.2f}); a real fitness difference would make it positive")
        var_c = fit_c.var(ddof=1)
        print(f"  share of candidate fitness variance from correctness: "
              f"{var_c / max(fit.var(ddof=1), 1e-12):.2f}")
        rows.append((g, tids, fit))
    try:
        st = load_run_state(run.root / "data/store/evolve_state.pkl")
        w = np.asarray(st.optimizer.es.sp.weights)[: len(cands) // 2]
        print(f"CMA recombination weights of the top {len(w)}: top-1 {w[0]:.3f}, top-2 together {w[:2].sum():.3f} of "
              f"{w.sum():.3f}: in gens 1-2 the two candidates with one lucky correct episode set ~"
              f"{w[:2].sum() / w.sum():.0%} of the mean's step")
    except Exception as e:  # noqa: BLE001
        print(f"(optimiser state unreadable: {e})")
    s2 = float(np.mean(pooled_within))
    s = math.sqrt(s2)
    n1 = s2 / 0.1 ** 2
    n2 = 2 * s2 / 0.1 ** 2
    print(f"\nper-episode reward std within a task (pooled over tasks and generations): {s:.3f}")
    print(f"  tasks per candidate for SE(fitness) = 0.1: n ≥ s²/0.01 = {n1:.1f}; to resolve a 0.1 difference "
          f"between two candidates at 1 sigma: n ≥ 2s²/0.01 = {n2:.1f} (at 2 sigma: {4 * n2:.0f}); now: 2")
    if pooled_solved:
        s2s = float(np.mean(pooled_solved))
        print(f"  on tasks some candidate solved (where correctness, the thing to learn, varies): s = "
              f"{math.sqrt(s2s):.3f} -> 1-sigma 0.1 difference needs n ≥ {2 * s2s / 0.01:.1f} tasks "
              f"(2 sigma: {8 * s2s / 0.01:.0f})")
    # signal: exact expected fitness of candidates drawn around the CMA mean
    L = run.L
    rng = np.random.default_rng(12345)
    mean, sig = cma_mean, cma_sigma
    K = n_heads
    X = mean[None, :] + sig * rng.standard_normal((K, mean.size))
    Ws = X.reshape(K, L + 3, run.d)
    print(f"\nsignal (indicative only: the explored part of the trees; unexplored mass counts 0): {K} candidates ~ "
          f"N(CMA mean, sigma={sig:.4f}²I); exact expected fitness on each generation's tasks")
    for g, tids, fit in rows:
        ex = [run.expect(run.tasks[t], Ws) for t in tids]
        f = np.mean([e["reward"] for e in ex], axis=0)
        unk = np.mean([e["unknown"] + e["unknown_grade"] for e in ex], axis=0)
        b = np.mean([e["bonus"] for e in ex], axis=0)
        print(f"  gen {g}: std of exact E[fitness] across candidates = {f.std():.4f} (bonus part {b.std():.4f}; "
              f"mean E[fitness] known-part {f.mean():.3f}, unknown mass {unk.mean():.3f}) vs observed std "
              f"{fit.std(ddof=1):.3f} -> signal share of variance ≈ {f.var() / max(fit.var(ddof=1), 1e-12):.3f}")
    ex = [run.expect(t, Ws) for t in run.train]
    f = np.mean([e["reward"] for e in ex], axis=0)
    unk = np.mean([e["unknown"] + e["unknown_grade"] for e in ex], axis=0)
    print(f"  all {len(run.train)} training tasks: std of exact E[fitness] across candidates {f.std():.4f} "
          f"(unknown mass {unk.mean():.3f})")
    # saved fitness curve vs exact
    ex0 = [run.expect(t, np.zeros((1, L + 3, run.d))) for t in run.train]
    ex1 = [run.expect(t, run.W[None]) for t in run.train]
    f0 = np.mean([e["reward"] for e in ex0])
    f1 = np.mean([e["reward"] for e in ex1])
    u0 = np.mean([e["unknown"] + e["unknown_grade"] for e in ex0])
    u1 = np.mean([e["unknown"] + e["unknown_grade"] for e in ex1])
    hist = [round(h["saved_fitness"], 3) for h in run.history]
    print(f"\nsaved_fitness per generation ({len(saved_fitness_episodes(run.settings, run.train))} fixed sampled episodes): {hist}; exact expected fitness on all "
          f"training tasks: zero head (x0) {f0:.3f} (unknown {u0:.3f}) vs saved head {f1:.3f} (unknown {u1:.3f})")
