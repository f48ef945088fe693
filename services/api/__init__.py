"""The HTTP job API of swerl (``python -m services.api``): submit and watch train, rollout and
eval jobs. State lives in Redis (:mod:`services.api.store`); rollout jobs are driven by the job
runner (:mod:`services.api.runner`) through the rollout manager; train jobs wait in Redis for a
trainer service (:mod:`services.api.claims` is their claim/lease/heartbeat protocol). See
docs/api.md.
"""
