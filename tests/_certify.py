"""A CPU backend that certifies every step it runs against the float64 reference.

For the weight-fuzzing property test: a run whose token sequence differs from the clean run is
only acceptable if each step was the lossless rule applied to that step's own inputs. Per
``select``: every sampled draft token is the inverse-CDF draw of the q it reports, with the
walk uniform (greedy: q one-hot on the draft). Per ``verify``: flags, accept lengths and tokens
equal the float64 reference verifier's on the same logits, drafts, q and noise. Violations are
collected, not raised, so the engine's own behaviour is what the test sees.
"""

from __future__ import annotations

import numpy as np
import torch

from dflash2rt.backend import TorchOpsBackend
from dflash2rt_conformance.reference import sampling as r_sampling, verify as r_verify


class CertifyingBackend(TorchOpsBackend):
    def __init__(self) -> None:
        super().__init__("cpu", "cpu", (torch.float32,))
        self.violations: list[str] = []
        self.steps = 0

    def select(self, logits, proj, anchor, pred_codebook, succ_codebook, params, sampling, u_walk):
        out = super().select(logits, proj, anchor, pred_codebook, succ_codebook, params,
                             sampling, u_walk)
        skip = (out.bad | out.bad_lattice).tolist()
        q, cand, draft = out.q.double().numpy(), out.candidates.numpy(), out.draft.numpy()
        for i, greedy in enumerate(sampling.greedy.tolist()):
            if skip[i]:
                continue
            for e in range(draft.shape[1]):
                row = q[i, e]
                if greedy:
                    ok = row.sum() == 1.0 and cand[i, e, int(np.argmax(row))] == draft[i, e]
                else:
                    idx = r_sampling.inverse_cdf(row, float(u_walk[i, e]))
                    ok = bool(np.isfinite(row).all()) and idx >= 0 \
                        and cand[i, e, idx] == draft[i, e]
                if not ok:
                    self.violations.append(f"select: request {i} slot {e}: draft "
                                           f"{draft[i, e]} is not the draw from q {row}")
        return out

    def verify(self, logits, draft, candidates, q, sampling, noise, check=True):
        out = super().verify(logits, draft, candidates, q, sampling, noise, check)
        self.steps += 1
        temps = sampling.temperature.double().numpy()
        ref = r_verify.verify(logits.float().numpy(), draft.numpy(), candidates.numpy(),
                              q.double().numpy(), temps, sampling.top_k.numpy(),
                              sampling.top_p.double().numpy(), sampling.greedy.numpy(),
                              noise.accept.double().numpy(), noise.residual.double().numpy(),
                              noise.bonus.double().numpy())
        for name in ("bad", "bad_q"):
            if not np.array_equal(getattr(out, name).numpy(), ref[name]):
                self.violations.append(f"verify: {name} {getattr(out, name).tolist()} != "
                                       f"reference {ref[name].tolist()}")
        keep = ~ref["bad"] & ~ref["bad_q"]
        for name in ("accept_len", "tokens"):
            if not np.array_equal(getattr(out, name).numpy()[keep], ref[name][keep]):
                self.violations.append(f"verify: {name} differs from the reference")
        return out
