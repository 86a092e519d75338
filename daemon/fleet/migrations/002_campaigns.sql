-- flare-diag fleet, version 2: campaigns, the queued runs of one plan on several hosts, claimed by
-- each host's daemon (FOR UPDATE SKIP LOCKED), woken by NOTIFY on flare_diag_runs.

CREATE TABLE campaigns (
  campaign      bigserial PRIMARY KEY,
  plan_name     text NOT NULL,
  plan_toml     text NOT NULL,
  plan_sha256   text NOT NULL,
  site          text NOT NULL,            -- a site name in each host's own sites directory
  time_scale    double precision NOT NULL DEFAULT 1,
  accept_partial boolean NOT NULL DEFAULT false,
  repeats       integer NOT NULL CHECK (repeats >= 1),
  created_at    timestamptz NOT NULL DEFAULT now(),
  created_by    text NOT NULL
);

CREATE TABLE runs (
  campaign      bigint NOT NULL REFERENCES campaigns (campaign),
  run           integer NOT NULL,         -- 1.. in the order the host is to run them
  host          text NOT NULL,
  repeat        integer NOT NULL,
  state         text NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'claimed', 'running', 'done', 'refused')),
  window_id     text,
  claimed_at    timestamptz,
  finished_at   timestamptz,
  outcome       text,
  verdict       text,
  restoration_verified boolean,
  detail        text NOT NULL DEFAULT '',
  PRIMARY KEY (campaign, run)
);
CREATE INDEX runs_queued ON runs (host, campaign, run) WHERE state = 'queued';
CREATE INDEX runs_window ON runs (window_id) WHERE window_id IS NOT NULL;

CREATE FUNCTION fleet_notify_run() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('flare_diag_runs', NEW.host);
  RETURN NEW;
END $$;
CREATE TRIGGER runs_notify AFTER INSERT OR UPDATE OF state ON runs
  FOR EACH ROW WHEN (NEW.state = 'queued') EXECUTE FUNCTION fleet_notify_run();

GRANT SELECT ON campaigns TO flare_diag_host;
GRANT SELECT, UPDATE ON runs TO flare_diag_host;

-- a follow-on campaign (the plan's [follow_on] order): the candidate's runs go to a site of their own
ALTER TABLE campaigns ADD COLUMN candidate_site text;
ALTER TABLE runs ADD COLUMN side text CHECK (side IN ('baseline', 'candidate'));
