-- flare-diag fleet, version 3: what `fleet status` reads at a thousand hosts without scanning windows
CREATE INDEX windows_running ON windows (host, opened_at DESC) WHERE closed_at IS NULL;
