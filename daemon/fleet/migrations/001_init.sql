-- flare-diag fleet, version 1: hosts' events shipped in order, the pools' leases, and what audits them.
-- Applied once by `flare-diag fleet init DSN`, inside one transaction, recorded in fleet_migrations.

CREATE TABLE pools (
  pool      text PRIMARY KEY,
  max_down  integer NOT NULL CHECK (max_down >= 0)
);

-- one row per host: its pool and the head of its chain as shipped (the anchor outside the host)
CREATE TABLE hosts (
  host           text PRIMARY KEY,
  pool           text NOT NULL,
  head_seq       bigint NOT NULL DEFAULT 0,
  head_hash      bytea,
  last_event_at  timestamptz,
  shipped_at     timestamptz
);

-- every committed event of every host, exactly as the host's SQLite log holds it
CREATE TABLE events (
  host           text NOT NULL,
  seq            bigint NOT NULL,
  window_id      text NOT NULL,
  type           text NOT NULL,
  schema_v       integer NOT NULL,
  mono_ns        bigint NOT NULL,
  wall_ns        bigint NOT NULL,
  causation_seq  bigint,
  payload        bytea NOT NULL,
  prev_hash      bytea NOT NULL,
  hash           bytea NOT NULL,
  PRIMARY KEY (host, seq)
);
CREATE INDEX events_window ON events (window_id, host, seq) WHERE window_id <> '';

CREATE FUNCTION fleet_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'flare-diag fleet: % on % refused: the table is append-only', TG_OP, TG_TABLE_NAME;
END $$;
CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
  FOR EACH ROW EXECUTE FUNCTION fleet_refuse_change();
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
  FOR EACH STATEMENT EXECUTE FUNCTION fleet_refuse_change();

-- the central side's own check: a host's head moves only forward, to events it holds, and the first
-- of them links to the old head (the shipper checks each link inside a batch, and
-- `fleet verify` recomputes every hash); a shipper that skipped its checks cannot move it past a fork
CREATE FUNCTION fleet_check_head() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.head_seq = OLD.head_seq AND NEW.head_hash IS NOT DISTINCT FROM OLD.head_hash THEN
    RETURN NEW;
  END IF;
  IF NEW.head_seq < OLD.head_seq THEN
    RAISE EXCEPTION 'host %: head may not move back from % to %', NEW.host, OLD.head_seq, NEW.head_seq;
  END IF;
  -- the batch's two ends must be held (a gap inside is the shipper's check, and `fleet verify` finds it)
  IF NOT EXISTS (SELECT 1 FROM events WHERE host = NEW.host AND seq = OLD.head_seq + 1) THEN
    RAISE EXCEPTION 'host %: events % to % are not all held', NEW.host, OLD.head_seq + 1, NEW.head_seq;
  END IF;
  IF OLD.head_seq > 0 AND OLD.head_hash IS DISTINCT FROM
      (SELECT prev_hash FROM events WHERE host = NEW.host AND seq = OLD.head_seq + 1) THEN
    RAISE EXCEPTION 'host %: fork at seq %: its prev_hash is not the head''s hash', NEW.host, OLD.head_seq + 1;
  END IF;
  IF NEW.head_hash IS DISTINCT FROM (SELECT hash FROM events WHERE host = NEW.host AND seq = NEW.head_seq) THEN
    RAISE EXCEPTION 'host %: head hash is not the hash of seq %', NEW.host, NEW.head_seq;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER hosts_head_continues BEFORE UPDATE OF head_seq, head_hash ON hosts
  FOR EACH ROW EXECUTE FUNCTION fleet_check_head();

-- one row per window, kept by the shipper from the events it ships (a view of them, for the fleet's lists)
CREATE TABLE windows (
  host                  text NOT NULL,
  window_id             text NOT NULL,
  pool                  text NOT NULL,
  plan                  text,
  opened_at             timestamptz,
  closed_at             timestamptz,
  outcome               text,
  verdict               text,
  restoration_verified  boolean,
  last_seq              bigint NOT NULL,
  PRIMARY KEY (host, window_id)
);
CREATE INDEX windows_opened ON windows (opened_at DESC);
CREATE INDEX windows_verdict ON windows (verdict, opened_at DESC);

-- the slots of a pool that are down now; a row is a held lease
CREATE TABLE leases (
  host       text PRIMARY KEY,
  pool       text NOT NULL REFERENCES pools (pool),
  window_id  text NOT NULL,
  state      text NOT NULL DEFAULT 'held' CHECK (state IN ('held', 'needs_a_person')),
  taken_at   timestamptz NOT NULL DEFAULT now(),
  detail     text NOT NULL DEFAULT ''
);
CREATE INDEX leases_pool ON leases (pool);

-- every change to a lease, with who made it: append-only like the events
CREATE TABLE lease_log (
  id         bigserial PRIMARY KEY,
  at         timestamptz NOT NULL DEFAULT now(),
  pool       text NOT NULL,
  host       text NOT NULL,
  window_id  text NOT NULL,
  change     text NOT NULL,
  caller     text NOT NULL,
  reason     text NOT NULL DEFAULT ''
);
CREATE TRIGGER lease_log_append_only BEFORE UPDATE OR DELETE ON lease_log
  FOR EACH ROW EXECUTE FUNCTION fleet_refuse_change();

-- a batch that did not continue a host's chain: a fork, raised on both sides
CREATE TABLE alarms (
  id      bigserial PRIMARY KEY,
  at      timestamptz NOT NULL DEFAULT now(),
  host    text NOT NULL,
  kind    text NOT NULL,
  detail  text NOT NULL
);

-- the role a daemon ships and leases as: it may add events, never change or remove them
DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'flare_diag_host') THEN
    CREATE ROLE flare_diag_host NOLOGIN;
  END IF;
END $$;
GRANT SELECT, INSERT ON events, windows, lease_log, alarms TO flare_diag_host;
GRANT SELECT, INSERT, UPDATE ON hosts TO flare_diag_host;
GRANT UPDATE ON windows TO flare_diag_host;
GRANT SELECT, INSERT, UPDATE, DELETE ON leases TO flare_diag_host;
GRANT SELECT ON pools TO flare_diag_host;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO flare_diag_host;
