"""Checks that standard input parses as Prometheus text exposition (0.0.4).

Usage: prom_check.py [METRIC ...] < text. Exits 1 naming the line on the
first problem; each METRIC given must have at least one sample. The grammar
is the one of https://prometheus.io/docs/instrumenting/exposition_formats/:
'# HELP name text', '# TYPE name type' (before the family's samples, once),
'name{label="value",...} value [timestamp]'.
"""
import re
import sys

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE = re.compile(r"^(%s)(\{(?:%s(?:,%s)*,?)?\})? (\S+)(?: (-?\d+))?$" % (NAME, LABEL, LABEL))
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def value_ok(v):
    if v in ("NaN", "+Inf", "-Inf"):
        return True
    try:
        float(v)
        return True
    except ValueError:
        return False


def main():
    typed, seen_samples, series = {}, set(), set()
    for n, line in enumerate(sys.stdin.read().split("\n"), 1):
        if line == "":
            continue
        def fail(why):
            sys.exit("line %d: %s: %r" % (n, why, line))
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                if not re.fullmatch(NAME, parts[2]):
                    fail("bad metric name")
                if parts[1] == "TYPE":
                    if len(parts) != 4 or parts[3] not in TYPES:
                        fail("bad TYPE")
                    if parts[2] in typed or parts[2] in seen_samples:
                        fail("TYPE repeated or after the family's samples")
                    typed[parts[2]] = parts[3]
            continue
        m = SAMPLE.match(line)
        if not m:
            fail("not a sample line")
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        if not value_ok(value):
            fail("bad value")
        if typed.get(name) == "counter" and value != "NaN" and float(value) < 0:
            fail("negative counter")
        key = name + labels
        if key in series:
            fail("duplicate series")
        series.add(key)
        seen_samples.add(name)
    missing = [m for m in sys.argv[1:] if m not in seen_samples]
    if missing:
        sys.exit("no sample of " + ", ".join(missing))
    print("prometheus text ok: %d series, %d families" % (len(series), len(seen_samples)))


if __name__ == "__main__":
    main()
