-- flare-diag fleet, version 5: a claimed run is its daemon's only while the daemon renews it (a visibility
-- timeout, as SQS and Celery's acks-late give one); an expired run goes back to the queue, at most
-- `retries` times, then fails with the reason. Runs may be cancelled and requeued by an operator.

ALTER TABLE campaigns ADD COLUMN retries integer NOT NULL DEFAULT 2 CHECK (retries >= 0);
ALTER TABLE campaigns ADD COLUMN visibility_s double precision NOT NULL DEFAULT 120 CHECK (visibility_s > 0);
ALTER TABLE runs ADD COLUMN lease_until timestamptz;
ALTER TABLE runs ADD COLUMN attempts integer NOT NULL DEFAULT 0;
ALTER TABLE runs DROP CONSTRAINT runs_state_check;
ALTER TABLE runs ADD CONSTRAINT runs_state_check
  CHECK (state IN ('queued', 'claimed', 'running', 'done', 'refused', 'failed', 'cancelled'));
CREATE INDEX runs_expiring ON runs (lease_until) WHERE state IN ('claimed', 'running');
