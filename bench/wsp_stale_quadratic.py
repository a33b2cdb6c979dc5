#!/usr/bin/env python3
"""Why sync.stale_update = "bypass" (docs/wsp.md, "Stale pushes"): the
largest stable step of heavy-ball SGD on a quadratic of curvature h when
part of each clock's gradient is s clocks stale, by rule. Per clock,
with a = lr * h and w the weight:

  none:   buf' = mu buf + c_f w_k + c_s w_(k-s);          w' = w - lr buf'
  scale:  the same with c_s / (1 + s)
  bypass: buf' = mu buf + c_f w_k; w' = w - lr buf' - lr c_s / (1 + s) w_(k-s)
  bypass_squared: the same with c_s / (1 + s)^2

(c_f, c_s: the fresh and the stale VWs' shares of the batch). A step is
stable when the iteration stays below |w| = 1 from w = 1; the edge is
the first unstable step scanning up from 0, refined by bisection. Pure arithmetic, no Morph binary.

  python3 bench/wsp_stale_quadratic.py [--mu 0.9] [--stale-share 11/16] [--staleness 0,1,2,4]
"""
import argparse
from fractions import Fraction


def stable(a, mu, s, c_f, c_s, rule, n=3000):
    f = 1.0 if rule == "none" or s == 0 else 1.0 / (1 + s) ** (2 if rule == "bypass_squared" else 1)
    bypass = rule in ("bypass", "bypass_squared") and s > 0
    w = [1.0] * (s + 2)
    buf = 0.0
    for _ in range(n):
        stale = c_s * f * w[-1 - s]
        buf = mu * buf + c_f * w[-1] + (0.0 if bypass else stale)
        w.append(w[-1] - a * buf - (a * stale if bypass else 0.0))
        w.pop(0)
        if abs(w[-1]) > 1e6:
            return False
    return max(abs(x) for x in w) < 1.0


def edge(mu, s, c_f, c_s, rule):
    # The first unstable step scanning up from 0 (the stable set need not
    # be an interval), then bisection between it and the last stable one.
    lo = 0.0
    while lo < 8.0 and stable(lo + 0.01, mu, s, c_f, c_s, rule):
        lo += 0.01
    hi = lo + 0.01
    for _ in range(12):
        m = (lo + hi) / 2
        if stable(m, mu, s, c_f, c_s, rule):
            lo = m
        else:
            hi = m
    return lo


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mu", type=float, default=0.9)
    ap.add_argument("--stale-share", default="11/16", help="the stale VW's share of the batch")
    ap.add_argument("--staleness", default="0,1,2,4")
    a = ap.parse_args()
    c_s = float(Fraction(a.stale_share))
    print("largest stable a = lr*h per clock, momentum %g, stale share %s" % (a.mu, a.stale_share))
    rules = ("none", "scale", "bypass", "bypass_squared")
    print("s | " + " | ".join(rules))
    for s in [int(x) for x in a.staleness.split(",")]:
        print("%d | %s" % (s, " | ".join("%.3f" % edge(a.mu, s, 1 - c_s, c_s, r) for r in rules)))


if __name__ == "__main__":
    main()
