-- Workflows (docs/workflows.md, "Data model"). A workflow is a named,
-- per-tenant graph of blocks; its definitions are versioned so that an edit
-- never changes a run in flight: every execution records the version it
-- started on and the runner loads exactly that version.

CREATE TABLE workflow (
    id              uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id       text        NOT NULL,
    name            text        NOT NULL,
    status          text        NOT NULL DEFAULT 'draft',
    current_version integer     NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    -- The name is how people and APIs address a workflow within a tenant.
    CONSTRAINT workflow_tenant_name_key UNIQUE (tenant_id, name),
    CONSTRAINT workflow_tenant_id_check CHECK (tenant_id <> ''),
    CONSTRAINT workflow_name_check CHECK (name <> '' AND char_length(name) <= 255),
    CONSTRAINT workflow_status_check CHECK (status IN ('draft', 'live')),
    CONSTRAINT workflow_current_version_check CHECK (current_version >= 1)
);
-- Event triggers look up a tenant's live workflows on every matching event.
CREATE INDEX workflow_tenant_live_idx ON workflow (tenant_id) WHERE status = 'live';

COMMENT ON TABLE workflow IS 'A tenant''s named workflow; its definitions are in workflow_version.';
COMMENT ON COLUMN workflow.tenant_id IS 'The tenant the workflow belongs to.';
COMMENT ON COLUMN workflow.name IS 'Unique within the tenant.';
COMMENT ON COLUMN workflow.status IS '`draft` (never triggered) or `live` (triggers start runs).';
COMMENT ON COLUMN workflow.current_version IS 'The version new executions start on (a row of workflow_version).';
COMMENT ON COLUMN workflow.updated_at IS 'The last save or status change.';

-- Every saved definition. Rows are never changed once an execution may have
-- started on them: saving a live workflow appends version n+1; only a draft
-- that is still current may be overwritten in place (see docs).
CREATE TABLE workflow_version (
    workflow_id uuid        NOT NULL REFERENCES workflow (id) ON DELETE CASCADE,
    version     integer     NOT NULL,
    definition  jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, version),
    CONSTRAINT workflow_version_version_check CHECK (version >= 1),
    CONSTRAINT workflow_version_definition_check CHECK (jsonb_typeof(definition) = 'object')
);
-- The current version must exist. Deferred: a save inserts the workflow and
-- its first version in one transaction.
ALTER TABLE workflow
    ADD CONSTRAINT workflow_current_version_fkey
    FOREIGN KEY (id, current_version) REFERENCES workflow_version (workflow_id, version)
    DEFERRABLE INITIALLY DEFERRED;

COMMENT ON TABLE workflow_version IS 'The saved definitions of a workflow, one row per version.';
COMMENT ON COLUMN workflow_version.version IS '1, 2, …: saving a live workflow appends the next version.';
COMMENT ON COLUMN workflow_version.definition IS 'The definition as validated when saved (blocks and edges).';
COMMENT ON COLUMN workflow_version.created_at IS 'When the version was (last) saved.';

-- One run of a workflow.
CREATE TABLE workflow_execution (
    id               uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id        text        NOT NULL,
    workflow_id      uuid        NOT NULL,
    workflow_version integer     NOT NULL,
    trigger_kind     text        NOT NULL,
    status           text        NOT NULL DEFAULT 'queued',
    input            jsonb       NOT NULL,
    output           jsonb       NULL,
    error            text        NULL,
    waiting_block    text        NULL,
    vars             jsonb       NOT NULL DEFAULT '{}',
    trigger_event_id uuid        NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz NULL,
    finished_at      timestamptz NULL,
    -- The execution runs the version it started on, whatever is saved later.
    CONSTRAINT workflow_execution_version_fkey
        FOREIGN KEY (workflow_id, workflow_version)
        REFERENCES workflow_version (workflow_id, version) ON DELETE CASCADE,
    CONSTRAINT workflow_execution_trigger_kind_check CHECK (
        trigger_kind IN ('manual', 'api', 'event', 'stream')
    ),
    CONSTRAINT workflow_execution_status_check CHECK (
        status IN ('queued', 'running', 'waiting', 'success', 'error', 'rejected')
    ),
    -- A waiting run always says which block waits, and only a waiting run
    -- does: the continue event resumes at that block.
    CONSTRAINT workflow_execution_waiting_check CHECK (
        (status = 'waiting') = (waiting_block IS NOT NULL)
    ),
    CONSTRAINT workflow_execution_vars_check CHECK (jsonb_typeof(vars) = 'object'),
    -- The fan-out key: one outbox event starts each workflow at most once,
    -- however often the event is redelivered. NULLs are distinct, so runs
    -- not started by an event are not limited.
    CONSTRAINT workflow_execution_trigger_event_key UNIQUE (workflow_id, trigger_event_id)
);
-- Listing a tenant's runs, newest first.
CREATE INDEX workflow_execution_tenant_created_idx ON workflow_execution (tenant_id, created_at);
-- Recovery finds runs stuck in queued or running since some instant.
CREATE INDEX workflow_execution_stuck_idx
    ON workflow_execution (status, updated_at)
    WHERE status IN ('queued', 'running');

COMMENT ON TABLE workflow_execution IS 'One run of a workflow, on the version it started on.';
COMMENT ON COLUMN workflow_execution.workflow_version IS 'The version the run started on; later saves do not change it.';
COMMENT ON COLUMN workflow_execution.trigger_kind IS '`manual`, `api`, `event` or `stream`.';
COMMENT ON COLUMN workflow_execution.status IS '`queued`, `running`, `waiting`, `success`, `error` or `rejected`.';
COMMENT ON COLUMN workflow_execution.input IS 'The trigger''s data, read by blocks as `input…`.';
COMMENT ON COLUMN workflow_execution.output IS 'The last block''s output once the run succeeded.';
COMMENT ON COLUMN workflow_execution.error IS 'Why the run ended in `error` or `rejected`.';
COMMENT ON COLUMN workflow_execution.waiting_block IS 'The block a `waiting` run waits in; set exactly when status is `waiting`.';
COMMENT ON COLUMN workflow_execution.vars IS 'The run''s variables (`vars…`), a JSON object.';
COMMENT ON COLUMN workflow_execution.trigger_event_id IS 'The outbox event that started the run; unique per workflow so a redelivered trigger starts it once.';
COMMENT ON COLUMN workflow_execution.updated_at IS 'The last change of status; recovery looks for old queued or running runs by it.';
COMMENT ON COLUMN workflow_execution.started_at IS 'When the runner first picked the run up.';
COMMENT ON COLUMN workflow_execution.finished_at IS 'When the run reached success, error or rejected.';

-- One row per block run, committed together with the block's effects on
-- this database: a redelivered job resumes at the first block without a
-- finished row instead of running finished blocks again.
CREATE TABLE workflow_block_execution (
    execution_id uuid        NOT NULL REFERENCES workflow_execution (id) ON DELETE CASCADE,
    block_id     text        NOT NULL,
    sequence     integer     NOT NULL,
    status       text        NOT NULL,
    output       jsonb       NULL,
    error        text        NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz NULL,
    PRIMARY KEY (execution_id, block_id, sequence),
    CONSTRAINT workflow_block_execution_sequence_check CHECK (sequence >= 1),
    CONSTRAINT workflow_block_execution_status_check CHECK (
        status IN ('success', 'error', 'waiting')
    )
);

COMMENT ON TABLE workflow_block_execution IS 'One row per block run of an execution, written with the block''s result.';
COMMENT ON COLUMN workflow_block_execution.block_id IS 'The block''s id in the definition.';
COMMENT ON COLUMN workflow_block_execution.sequence IS 'The block''s run number within the execution: 1, then 2 after a retry or a resumed wait.';
COMMENT ON COLUMN workflow_block_execution.status IS '`success`, `error` or `waiting`.';
COMMENT ON COLUMN workflow_block_execution.output IS 'The block''s output (`blocks.<id>.output`).';
COMMENT ON COLUMN workflow_block_execution.error IS 'Why the block failed.';

-- The generic entity rows the row blocks (rowGet, rowCreate, rowUpdate,
-- rowDelete) read and write.
CREATE TABLE entity_row (
    id         uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id  text        NOT NULL,
    entity     text        NOT NULL,
    data       jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    deleted_at timestamptz NULL,
    CONSTRAINT entity_row_data_check CHECK (jsonb_typeof(data) = 'object')
);
CREATE INDEX entity_row_tenant_entity_idx ON entity_row (tenant_id, entity) WHERE deleted_at IS NULL;

COMMENT ON TABLE entity_row IS 'Generic entity rows of a tenant, read and written by the row blocks.';
COMMENT ON COLUMN entity_row.entity IS 'The entity (an identifier, e.g. `order`).';
COMMENT ON COLUMN entity_row.data IS 'The row''s fields, a JSON object.';
COMMENT ON COLUMN entity_row.deleted_at IS 'Set by rowDelete; a deleted row is kept but no longer found.';

-- Application events (row.created, custom names): what eventTrigger
-- workflows match on, by entity and event name.
CREATE TABLE application_event (
    id         uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id  text        NOT NULL,
    entity     text        NOT NULL,
    event      text        NOT NULL,
    row_id     uuid        NULL,
    data       jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX application_event_tenant_created_idx ON application_event (tenant_id, created_at);

COMMENT ON TABLE application_event IS 'Events of the application (`row.created`, custom names) that eventTrigger workflows match.';
COMMENT ON COLUMN application_event.entity IS 'The entity the event is about.';
COMMENT ON COLUMN application_event.event IS '`row.created`, `row.updated`, `row.deleted` or a custom event name.';
COMMENT ON COLUMN application_event.row_id IS 'The entity_row concerned, for row.* events.';
COMMENT ON COLUMN application_event.data IS 'The event''s payload: the trigger input of the workflows it starts.';
