-- An event was appended: wakes the projector (NOTIFY bf4ps_events, empty
-- payload). The trigger's WHEN reads the bf4ps.notify_events setting:
-- 'off' never notifies, 'all' every insert, anything else ('outcomes', the
-- default) every event but claimed/started.
--
-- owner: migrator
-- execute: PUBLIC
CREATE OR REPLACE FUNCTION @schema@.bf4ps_notify_event() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, @schema@, pg_temp
AS $$
BEGIN
    PERFORM pg_notify('bf4ps_events', '');
    RETURN NULL;
END;
$$;

-- bf4ps.notify_events: 'off' never notifies, 'all' every insert, anything
-- else ('outcomes', the default) every event but claimed/started.
CREATE OR REPLACE TRIGGER trg_collection_events_notify
    AFTER INSERT ON @schema@.collection_events
    FOR EACH ROW
    WHEN (coalesce(current_setting('bf4ps.notify_events', true), '') = 'all'
          OR (coalesce(current_setting('bf4ps.notify_events', true), '') <> 'off'
              AND NEW.event_type NOT IN ('claimed', 'started')))
    EXECUTE FUNCTION @schema@.bf4ps_notify_event();
