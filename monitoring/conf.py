"""The monitoring app's settings, with their defaults (read as `portal.appsettings` says: Django's setting,
else the environment variable of that name, else the default here)."""

from portal.appsettings import AppSettings, Setting

settings = AppSettings(
    # How long each form of GPU figures is kept: raw samples (whole days, dropped as partitions), 5-minute
    # and 1-hour roll-ups (min / avg / max).
    MONITORING_RAW_DAYS=Setting.int(3, minimum=1),
    MONITORING_5M_DAYS=Setting.int(35, minimum=1),
    MONITORING_1H_DAYS=Setting.int(400, minimum=1),
    # Samples are refused when older than this (an agent's buffer holds at most about this much) or more
    # than MONITORING_SAMPLE_MAX_AHEAD_SECONDS in the future (a host's clock gone wrong).
    MONITORING_SAMPLE_MAX_AGE_SECONDS=Setting.int(6 * 3600, minimum=1),
    MONITORING_SAMPLE_MAX_AHEAD_SECONDS=Setting.int(300, minimum=0),
    # The most readings (hosts × instants) and GPUs one batch from an agent may carry.
    MONITORING_BATCH_MAX_READINGS=Setting.int(1000, minimum=1),
    MONITORING_BATCH_MAX_GPUS=Setting.int(20000, minimum=1),
    # Agents' batches are checked as they come and stored a moment later, many in one transaction
    # (monitoring/ingest/accepted.py): at most MONITORING_STORE_BATCHES a transaction. The writer's task runs
    # when the first batch waits and every MONITORING_STORE_SECONDS besides, and stores until no batch has
    # come for MONITORING_STORE_LINGER_SECONDS (at most 10), or for MONITORING_STORE_SECONDS at most, then
    # sends for itself again behind the queue's other tasks; its rounds begin MONITORING_STORE_GATHER_SECONDS
    # (at most 10) apart at least, unless a full round waits, so that a round's few statements are shared by
    # more batches (each waits that much longer at most); its lock lasts MONITORING_STORE_LOCK_SECONDS past
    # each round. Once MONITORING_ACCEPTED_MAX_BATCHES wait, agents are answered 503 and keep their readings
    # for later.
    MONITORING_STORE_BATCHES=Setting.int(2000, minimum=1),
    MONITORING_STORE_SECONDS=Setting.int(15, minimum=1),
    MONITORING_STORE_LINGER_SECONDS=Setting.float(0.5, minimum=0.0),
    MONITORING_STORE_GATHER_SECONDS=Setting.float(0.25, minimum=0.0),
    MONITORING_STORE_LOCK_SECONDS=Setting.int(120, minimum=10),
    MONITORING_ACCEPTED_MAX_BATCHES=Setting.int(50000, minimum=1),
    # Each web process keeps what it read of an agent's token and host for this long, this many of each at
    # most (monitoring/ingest/copies.py: a revocation still stops a token at once); 0 reads both each time.
    MONITORING_AGENT_COPY_SECONDS=Setting.int(300, minimum=0),
    MONITORING_AGENT_COPIES=Setting.int(20000, minimum=1),
    # How often the portal itself collects: the simulated fleet, and clusters with a Prometheus URL.
    MONITORING_COLLECT_SECONDS=Setting.int(30, minimum=1),
    # Collection, roll-ups, pruning, alert evaluation and the notifications of alerts, GPU faults and idle
    # pools wait on a queue of their own, never behind provisioning, metering, what-if runs or the portal's
    # other e-mail; the workers of deploy/kubernetes/monitoring-worker-deployment.yaml and ./scripts/run
    # consume it, the others not.
    MONITORING_QUEUE=Setting.str("monitoring"),
    MONITORING_PROMETHEUS_TIMEOUT_SECONDS=Setting.float(5.0, minimum=0.1),
    # How long the figures of the whole fleet (or of a cluster, GPU group or node) that the fleet page and the
    # capacity pages show are kept once worked out, for every process (monitoring/selectors/kept.py); 0 works
    # them out on every view.
    MONITORING_FIGURES_SECONDS=Setting.int(15, minimum=0),
    # The simulated fleet has an uncorrected ECC error on a GPU with a chance of one in this many per
    # minute (about one a day on the demo's fleet), which drains that GPU as a real one would be.
    MONITORING_SIMULATED_ECC_ONE_IN=Setting.int(150000, minimum=1),
    # Alerts: a threshold holds over a duration when the samples in it are never further apart than
    # MONITORING_ALERT_SAMPLE_GAP_SECONDS (nor further from its ends). Notifications go by e-mail to the
    # operators and as a JSON POST to MONITORING_ALERT_WEBHOOK_URL (if set; a rule may name another webhook
    # as well), each retried after MONITORING_ALERT_RETRY_SECONDS, doubling up to
    # MONITORING_ALERT_RETRY_MAX_SECONDS, until MONITORING_ALERT_MAX_ATTEMPTS tries have failed. The
    # e-mails about GPU faults go the same way.
    MONITORING_ALERT_SAMPLE_GAP_SECONDS=Setting.int(120, minimum=1),
    MONITORING_ALERT_WEBHOOK_URL=Setting.str(""),
    MONITORING_ALERT_WEBHOOK_TIMEOUT_SECONDS=Setting.float(5.0, minimum=0.1),
    MONITORING_ALERT_RETRY_SECONDS=Setting.int(30, minimum=1),
    MONITORING_ALERT_RETRY_MAX_SECONDS=Setting.int(3600, minimum=1),
    MONITORING_ALERT_MAX_ATTEMPTS=Setting.int(10, minimum=1),
)
