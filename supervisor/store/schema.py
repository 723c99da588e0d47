"""The store's schema, as the migrations that build it: entry i takes a store from version i to
i+1 (SQLite's `user_version`).  Never edit a shipped entry: append one."""

from __future__ import annotations

# Each entry migrates the schema from version i to i+1.  Never edit a shipped entry: append.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE jobs (
        name TEXT PRIMARY KEY,
        spec_json TEXT NOT NULL,
        state TEXT NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        created REAL NOT NULL,
        updated REAL NOT NULL
    );
    CREATE TABLE attempts (
        job TEXT NOT NULL REFERENCES jobs(name),
        n INTEGER NOT NULL,
        tag TEXT NOT NULL UNIQUE,
        host TEXT NOT NULL,
        argv_json TEXT NOT NULL,
        workdir TEXT NOT NULL,
        log_path TEXT NOT NULL,
        status_path TEXT NOT NULL,
        pid INTEGER,
        pgid INTEGER,
        start_time REAL,
        started REAL NOT NULL,
        ended REAL,
        state TEXT NOT NULL,
        exit_code INTEGER,
        exit_signal INTEGER,
        log_offset INTEGER NOT NULL DEFAULT 0,
        phase TEXT,
        progress_json TEXT,
        verdict TEXT,
        reason TEXT,
        failure_json TEXT,
        fingerprint TEXT,
        action TEXT,
        PRIMARY KEY (job, n)
    );
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        ts REAL NOT NULL,
        kind TEXT NOT NULL,
        probe TEXT,
        phase TEXT,
        log_offset INTEGER,
        message TEXT NOT NULL,
        data_json TEXT NOT NULL
    );
    CREATE INDEX events_by_attempt ON events(job, attempt, id);
    -- A probe event is identified by where in the log it came from: re-reading a stretch of
    -- log after a restart can then never store the same event twice.
    CREATE UNIQUE INDEX events_probe_once ON events(job, attempt, kind, probe, log_offset)
        WHERE log_offset IS NOT NULL;
    CREATE TABLE gpu_samples (
        ts REAL NOT NULL,
        host TEXT NOT NULL,
        gpu INTEGER NOT NULL,
        used_mib INTEGER NOT NULL,
        total_mib INTEGER NOT NULL,
        util_pct INTEGER,
        PRIMARY KEY (host, gpu, ts)
    );
    """,
    # The run an attempt belongs to (+1 at each `supervise start`; relaunches stay in their run).
    # Attempts stored before get the run the old rule gave them, once: a run went on while the
    # previous attempt's action was 'relaunch ...'.
    """
    ALTER TABLE attempts ADD COLUMN run INTEGER NOT NULL DEFAULT 1;
    UPDATE attempts SET run = (
        SELECT runs.run FROM (
            SELECT job, n, SUM(CASE WHEN substr(previous, 1, 8) = 'relaunch' THEN 0 ELSE 1 END)
                OVER (PARTITION BY job ORDER BY n) AS run
            FROM (SELECT job, n, LAG(action) OVER (PARTITION BY job ORDER BY n) AS previous FROM attempts)
        ) AS runs
        WHERE runs.job = attempts.job AND runs.n = attempts.n
    );
    """,
    # Offsets restart at 0 when a log is truncated or rotated: a probe event is identified by
    # the log's generation too (Record.generation), and the resume offset is stored with its own.
    """
    ALTER TABLE events ADD COLUMN log_generation INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE attempts ADD COLUMN log_generation INTEGER NOT NULL DEFAULT 0;
    DROP INDEX events_probe_once;
    CREATE UNIQUE INDEX events_probe_once_per_generation
        ON events(job, attempt, kind, probe, log_generation, log_offset) WHERE log_offset IS NOT NULL;
    """,
    # A batch scheduler's id for an attempt (a Slurm job id): what re-adopts it after a restart.
    """
    ALTER TABLE attempts ADD COLUMN scheduler_id TEXT;
    """,
    # Pipelines (supervisor/jobs/pipelines.py): each step is a job (`PIPELINE.STEP`); this keeps which
    # steps a pipeline has, in order, and which its last start skipped.
    """
    CREATE TABLE pipelines (
        name TEXT PRIMARY KEY,
        spec_path TEXT NOT NULL,
        overrides_json TEXT NOT NULL,
        steps_json TEXT NOT NULL,
        started REAL NOT NULL
    );
    """,
    # The shard an attempt ran (sharding.py): NULL for an unsharded job's attempts, -1 for a gather.
    """
    ALTER TABLE attempts ADD COLUMN shard INTEGER;
    """,
    # Each bar's intervals as an attempt measured them (jobs/paces.py): the next attempt of the
    # same job, spec and host kind starts its stall bounds from them.
    """
    CREATE TABLE bar_paces (
        job TEXT NOT NULL,
        spec_fingerprint TEXT NOT NULL,
        host_kind TEXT NOT NULL,
        bar TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        intervals_json TEXT NOT NULL,
        recorded REAL NOT NULL,
        PRIMARY KEY (job, attempt, bar)
    );
    CREATE INDEX bar_paces_history ON bar_paces(job, spec_fingerprint, host_kind, bar, attempt);
    """,
    # The daemon's heartbeat (one row): when the daemon was last known alive, so that the next
    # one can say how long jobs went unwatched after a crash or a SIGKILL (service.py).
    """
    CREATE TABLE daemon_heartbeat (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        ts REAL NOT NULL
    );
    """,
    # What an attempt used (usage.py): CPU seconds, peak memory and tasks from its cgroup, GPU
    # memory and GPU-seconds from the samples; NULL for attempts stored before, or still running.
    """
    ALTER TABLE attempts ADD COLUMN usage_json TEXT;
    """,
    # Progress as milestones (jobs/milestones.py): a bar's rows thinned to its first and last,
    # each change of its whole percent (a bar with a total) or one per 30 s (one without).  A bar
    # is told by its probe, its description and its writer's prefix fields, per attempt.
    """
    WITH p AS (
        SELECT id, job, attempt, ts, COALESCE(probe, '') AS probe,
               CASE WHEN json_valid(data_json) THEN data_json END AS d
        FROM events WHERE kind = 'progress'
    ), bars AS (
        SELECT id, job, attempt,
               probe || '|' || COALESCE(json_extract(d, '$.desc'), '') || '|' || COALESCE(json_extract(d, '$.service'), '')
                   || '|' || COALESCE(json_extract(d, '$.host'), '') || '|' || COALESCE(json_extract(d, '$.tee'), '')
                   || '|' || COALESCE(json_extract(d, '$.proc'), '') || '|' || COALESCE(json_extract(d, '$.rank'), '')
                   || '|' || COALESCE(json_extract(d, '$.pid'), '') AS bar,
               CASE WHEN CAST(json_extract(d, '$.total') AS REAL) > 0
                    THEN CAST(100 * MIN(CAST(json_extract(d, '$.done') AS REAL), CAST(json_extract(d, '$.total') AS REAL))
                              / CAST(json_extract(d, '$.total') AS REAL) AS INTEGER) END AS pct,
               CAST(ts / 30 AS INTEGER) AS bucket
        FROM p WHERE json_extract(d, '$.done') IS NOT NULL
    ), marked AS (
        SELECT id, pct, bucket,
               LAG(id) OVER w AS prev_id, LEAD(id) OVER w AS next_id,
               LAG(pct) OVER w AS prev_pct, LAG(bucket) OVER w AS prev_bucket
        FROM bars WINDOW w AS (PARTITION BY job, attempt, bar ORDER BY id)
    )
    DELETE FROM events WHERE id IN (
        SELECT id FROM marked
        WHERE prev_id IS NOT NULL AND next_id IS NOT NULL
          AND ((pct IS NOT NULL AND pct IS prev_pct) OR (pct IS NULL AND bucket IS prev_bucket))
    );
    """,
    # What an attempt started from (jobs/checkpoints.py, spec/adjust.py): the checkpoint that was its
    # {last_checkpoint}, and its [params] where a `[restart.adjust]` rule changed them; NULL: none / the spec's.
    """
    ALTER TABLE attempts ADD COLUMN checkpoint TEXT;
    ALTER TABLE attempts ADD COLUMN params_json TEXT;
    """,
    # What was done when an attempt ended, as its own column (core/actions.py's ActionKind), read
    # once from the sentence each version stored in `action` (its first words name the kind).  Two
    # steps: the column, then its values (a step that may run again over its own result).
    """
    ALTER TABLE attempts ADD COLUMN action_kind TEXT;
    """,
    """
    UPDATE attempts SET action_kind = CASE
        WHEN action IS NULL THEN NULL
        WHEN substr(action, 1, 8) = 'relaunch' THEN 'relaunch'
        WHEN substr(action, 1, 7) = 'give up' THEN 'give_up'
        WHEN substr(action, 1, 15) = 'stopped by user' THEN 'stop'
        ELSE 'none'
    END;
    """,
    # GPUs and hosts kept away from (supervisor/jobs/quarantine.py): a GPU after a hardware fault, a
    # host after repeated `killed`/`unreachable` verdicts, until `until` (wall clock) or a
    # `supervise quarantine --clear`.  gpu NULL: the whole host.  One row per GPU or host.
    """
    CREATE TABLE IF NOT EXISTS quarantine (
        host TEXT NOT NULL,
        gpu INTEGER,
        reason TEXT NOT NULL,
        since REAL NOT NULL,
        until REAL NOT NULL
    );
    CREATE UNIQUE INDEX IF NOT EXISTS quarantine_one_per_place ON quarantine(host, COALESCE(gpu, -1));
    """,
)
