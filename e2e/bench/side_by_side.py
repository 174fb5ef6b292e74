"""The figures of a side-by-side benchmark (side-by-side.sh), imported by the reports of
policies.sh and client.sh.

In: the records, `round name metric value` lines, where a name is `bare-alone` (the bare route
alone), a variant, or `bare@VARIANT` (the bare route beside that variant).
"""
import statistics
from collections import defaultdict


class Runs:
    def __init__(self, raw):
        self.v = defaultdict(dict)  # (round, bare-alone | variant | bare@variant) -> metric -> value
        for line in open(raw):
            r, var, m, val = line.rstrip("\n").split("\t")
            self.v[(r, var)][m] = float(val)
        self.rounds = sorted({r for r, _ in self.v}, key=int)

    def ratio(self, var):
        """The median across rounds of the variant's requests per proxy CPU-second over the bare
        route's beside it, and the per-round ratios."""
        xs = [self.v[(r, var)]["rps_per_core"] / self.v[(r, "bare@" + var)]["rps_per_core"]
              for r in self.rounds]
        return statistics.median(xs), xs

    def med(self, var, m):
        return statistics.median(self.v[(r, var)][m] for r in self.rounds)

    def errors(self, var):
        """Non-2xx answers and socket errors of the variant and the bare route beside it."""
        return sum(self.v[(r, var)]["errors"] + self.v[(r, "bare@" + var)]["errors"]
                   for r in self.rounds)

    def alone_errors(self):
        return sum(self.v[(r, "bare-alone")]["errors"] for r in self.rounds)

    def share(self, twin="twin"):
        """What sharing a core costs the bare route: its CPU per request beside the twin over
        alone, in the same round (seconds apart, so noisy; the median across rounds)."""
        return statistics.median(self.v[(r, "bare-alone")]["rps_per_core"]
                                 / self.v[(r, "bare@" + twin)]["rps_per_core"] - 1
                                 for r in self.rounds)

    def alone(self):
        """The bare route alone's requests per proxy CPU-second, per round."""
        return [self.v[(r, "bare-alone")]["rps_per_core"] for r in self.rounds]
