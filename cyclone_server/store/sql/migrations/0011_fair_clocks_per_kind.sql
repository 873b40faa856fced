-- Fair clocks per kind and key.
--
-- A key's virtual clock (where its next step is placed in the fair order) was kept per
-- token, so the kinds a limit attaches to shared it, while each kind has a virtual time of
-- its own. A tenant busy in a fast kind then had its clock far ahead of a slow kind's
-- virtual time, and its steps in the slow kind were placed behind every other tenant's
-- there. Each (kind, token) now has its own clock.
--
-- The clocks are rebuilt from the old ones: every (kind, token) with steps placed and
-- waiting starts at its token's old clock, at or past the place of each of those steps, so
-- FIFO within a key holds for the steps that come next; keys with no step waiting start
-- afresh (placed at their kind's virtual time, as the tidy leaves idle keys). The table is
-- small (one row per key in use) and the steps are read through cyclone_steps_claim_heads.
-- The old table is locked first, so that no step is placed under it between the copy and
-- the drop; the functions that use the new one come in the same transaction (migrate).
LOCK TABLE cyclone_fair_keys IN ACCESS EXCLUSIVE MODE;
CREATE TABLE cyclone_fair_keys_by_kind (
    kind   text             NOT NULL,
    token  text             NOT NULL,
    vclock double precision NOT NULL,
    PRIMARY KEY (kind, token)
);
INSERT INTO cyclone_fair_keys_by_kind (kind, token, vclock)
SELECT w.kind, f.token, f.vclock
  FROM (SELECT DISTINCT s.kind, s.limit_keys[1] AS token FROM cyclone_steps s
         WHERE s.state = 'available' AND s.limit_keys IS NOT NULL AND s.fair_at IS NOT NULL) w
  JOIN cyclone_fair_keys f ON f.token = w.token;
DROP TABLE cyclone_fair_keys;
ALTER TABLE cyclone_fair_keys_by_kind RENAME TO cyclone_fair_keys;
ALTER INDEX cyclone_fair_keys_by_kind_pkey RENAME TO cyclone_fair_keys_pkey;
