"""The streaming read: the driver's coordinator (planning, commit, ownership, member consumers, pins) and the
pinned pull reader for streams without Direct Get."""
