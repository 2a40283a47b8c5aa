"""``specserve doctor``: checks a target and its draft / Medusa / EAGLE-3 head before deploy.

Static checks over the checkpoints' files (:mod:`~specserve.doctor.checks`, pure, over
:mod:`~specserve.doctor.sides`), a KV and verify-workspace budget for a named GPU and batch
(:mod:`~specserve.doctor.memory`), and a short measured acceptance probe on the reference engine
(:mod:`~specserve.doctor.probe`); :func:`~specserve.doctor.run.doctor` assembles the report.
Findings are one line each with a severity and a stable code
(:mod:`~specserve.doctor.findings`).
"""
