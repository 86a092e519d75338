-- flare-diag fleet, version 4: a lease belongs to a window and carries a fencing epoch; each host's
-- login role writes only its own rows (row-level security), and operators have a role of their own.

-- the fencing token (Kleppmann): every grant takes the next value, so a holder's epoch says which grant
-- it holds, and a stale one (a lease released and granted again since) can be told apart
CREATE SEQUENCE lease_epoch;
ALTER TABLE leases ADD COLUMN epoch bigint NOT NULL DEFAULT nextval('lease_epoch');
ALTER TABLE lease_log ADD COLUMN epoch bigint;
GRANT USAGE ON SEQUENCE lease_epoch TO flare_diag_host;

-- the pool's row is no longer locked FOR UPDATE (which needs UPDATE on it): a lease is decided under a
-- transaction-scoped advisory lock on the pool's name, which needs no privilege and ends with the
-- transaction (a dropped connection frees it; a granted lease stays a row)

-- the people who run the fleet: pools, leases by hand, campaigns; never a host's events
DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'flare_diag_operator') THEN
    CREATE ROLE flare_diag_operator NOLOGIN;
  END IF;
END $$;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO flare_diag_operator;
GRANT INSERT, UPDATE ON pools TO flare_diag_operator;
GRANT UPDATE, DELETE ON leases TO flare_diag_operator;
GRANT INSERT ON lease_log TO flare_diag_operator;
GRANT INSERT, UPDATE ON campaigns, runs TO flare_diag_operator;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO flare_diag_operator;

-- a host's login role is named as the host (`flare-diag fleet host add HOST`): it reads what the pool
-- needs (every lease of the pool, for the count) and writes only rows of its own
-- (a direct member of flare_diag_host is a host; pg_has_role would call every superuser one)
CREATE FUNCTION fleet_is_host() RETURNS boolean LANGUAGE sql STABLE AS
  $$ SELECT EXISTS (SELECT 1 FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid
                    WHERE g.rolname = 'flare_diag_host' AND m.member = (SELECT oid FROM pg_roles WHERE rolname = current_user)) $$;
CREATE FUNCTION fleet_own_host(h text) RETURNS boolean LANGUAGE sql STABLE AS
  $$ SELECT h = current_user OR NOT fleet_is_host() $$;

ALTER TABLE leases ENABLE ROW LEVEL SECURITY;
CREATE POLICY leases_read ON leases FOR SELECT USING (true);
CREATE POLICY leases_insert ON leases FOR INSERT WITH CHECK (fleet_own_host(host));
CREATE POLICY leases_update ON leases FOR UPDATE USING (fleet_own_host(host)) WITH CHECK (fleet_own_host(host));
CREATE POLICY leases_delete ON leases FOR DELETE USING (fleet_own_host(host));

ALTER TABLE lease_log ENABLE ROW LEVEL SECURITY;
CREATE POLICY lease_log_read ON lease_log FOR SELECT USING (true);
CREATE POLICY lease_log_insert ON lease_log FOR INSERT WITH CHECK (fleet_own_host(host));

-- events arrive by COPY, which row-level security refuses: a row trigger holds a host to its own rows
-- instead (its common path is one comparison). Reads stay open: an event carries no secret
CREATE FUNCTION fleet_own_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.host = current_user OR fleet_own_host(NEW.host) THEN
    RETURN NEW;
  END IF;
  RAISE EXCEPTION 'flare-diag fleet: role % may not add events of host %', current_user, NEW.host
    USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER events_own_host BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION fleet_own_event();

ALTER TABLE hosts ENABLE ROW LEVEL SECURITY;
CREATE POLICY hosts_read ON hosts FOR SELECT USING (true);
CREATE POLICY hosts_insert ON hosts FOR INSERT WITH CHECK (fleet_own_host(host));
CREATE POLICY hosts_update ON hosts FOR UPDATE USING (fleet_own_host(host)) WITH CHECK (fleet_own_host(host));

ALTER TABLE windows ENABLE ROW LEVEL SECURITY;
CREATE POLICY windows_read ON windows FOR SELECT USING (fleet_own_host(host));
CREATE POLICY windows_insert ON windows FOR INSERT WITH CHECK (fleet_own_host(host));
CREATE POLICY windows_update ON windows FOR UPDATE USING (fleet_own_host(host)) WITH CHECK (fleet_own_host(host));

ALTER TABLE alarms ENABLE ROW LEVEL SECURITY;
CREATE POLICY alarms_read ON alarms FOR SELECT USING (fleet_own_host(host));
CREATE POLICY alarms_insert ON alarms FOR INSERT WITH CHECK (fleet_own_host(host));

ALTER TABLE runs ENABLE ROW LEVEL SECURITY;
CREATE POLICY runs_read ON runs FOR SELECT USING (fleet_own_host(host));
CREATE POLICY runs_update ON runs FOR UPDATE USING (fleet_own_host(host)) WITH CHECK (fleet_own_host(host));
CREATE POLICY runs_insert ON runs FOR INSERT WITH CHECK (NOT fleet_is_host());
