"""Option parsing: names, types, defaults and the errors users see."""

from __future__ import annotations

import re

import pytest

from spark_jetstream.client.connection import ConnectionOptions
from spark_jetstream.errors import OptionError
from spark_jetstream.options import (
    BATCH,
    CONNECTION_OPTIONS,
    LOAD,
    OPTIONS,
    PULL_OPTIONS,
    READER_OPTIONS,
    STREAM,
    WRITE,
    parse_connection_options,
    parse_duration,
    parse_options,
)
from spark_jetstream.options.kafka import KAFKA_OPTIONS
from spark_jetstream.streaming.pull import PullSettings


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("5s", 5.0), ("2m", 120.0), ("1h", 3600.0), ("1.5", 1.5), (" 3 S ", 3.0)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_connection_options_from_user_strings():
    options = parse_connection_options(
        {
            "SERVERS": "a.example:4223, nats://b.example",
            "connecttimeout": "750ms",
            "tls.ca": "/ca.pem",
            "user": "u",
            "password": "p",
            "domain": "hub",
        }
    )
    assert options.servers == ("nats://a.example:4223", "nats://b.example:4222")
    assert options.connect_timeout == 0.75
    assert options.tls_ca == "/ca.pem"
    assert options.api_prefix == "$JS.hub.API"
    assert ConnectionOptions().api_prefix == "$JS.API"


def test_unknown_option_suggests_the_closest_name():
    with pytest.raises(OptionError, match=re.escape("Unknown option 'connectTimout'. Did you mean 'connectTimeout'?")):
        parse_connection_options({"connectTimout": "5s"})


@pytest.mark.parametrize(
    ("mode", "key", "message"),
    [
        (STREAM, "maxOffsetsPerTrigger", "Kafka's 'maxOffsetsPerTrigger' is 'maxMessagesPerTrigger' here."),
        (
            STREAM,
            "minOffsetsPerTrigger",
            "Kafka's 'minOffsetsPerTrigger' is 'minMessagesPerTrigger' here, bounded by 'maxTriggerDelay' as in Kafka.",
        ),
        (
            STREAM,
            "maxRecordsPerPartition",
            "Kafka's 'maxRecordsPerPartition' is 'maxRangePerPartition' here for batch reads (stream sequences per "
            "Spark partition); a streaming read has no equivalent: raise 'minPartitions' to cut its batches finer.",
        ),
        (
            BATCH,
            "endingOffsets",
            "Kafka's 'endingOffsets' is 'endingPosition' here (batch reads), and it is inclusive: the last stream "
            "sequence read, where Kafka's ending offset is the first one not read.",
        ),
        (
            STREAM,
            "STARTINGOFFSETS",
            "Kafka's 'startingOffsets' is 'startingPosition' here: 'earliest', 'latest', 'group' or one stream "
            "sequence (no JSON per partition). A streaming read starts at 'earliest' by default (at 'group' when the "
            "group's member consumers exist), where Kafka's starts at 'latest'.",
        ),
        (
            STREAM,
            "kafka.bootstrap.servers",
            "Kafka's 'kafka.bootstrap.servers' is 'servers' here: comma-separated NATS server URLs such as "
            "'nats://host:4222'.",
        ),
        (
            STREAM,
            "assign",
            "Kafka's 'assign' has no equivalent: a read takes a whole 'stream', the subjects 'subjects' selects, or "
            "what the member consumers of a 'group' select.",
        ),
        (
            STREAM,
            "groupIdPrefix",
            "Kafka's 'groupIdPrefix' has no equivalent: Spark's Kafka source names consumer groups that keep no "
            "position; here 'group' names a consumer group whose member consumers hold the query's position.",
        ),
        (
            WRITE,
            "topic",
            "Kafka's 'topic' is 'subject' here (writes): the subject of rows without a 'subject' column; the stream "
            "whose subjects match it stores them.",
        ),
        (
            STREAM,
            "kafka.security.protocol",
            "Kafka's client setting 'kafka.security.protocol' has no equivalent: a connection takes 'servers', "
            "'creds', 'nkey', 'token', 'user' and 'password', and 'tls.*'.",
        ),
    ],
)
def test_kafka_option_names_say_what_they_are_here(mode, key, message):
    """Spark's Kafka option names get a sentence naming this connector's equivalent (or saying there is none), never
    the closest name by spelling ('maxOffsetsPerTrigger' once got 'maxBytesPerTrigger')."""
    raw = {"stream": "S"} if mode != WRITE else {}
    with pytest.raises(OptionError) as caught:
        parse_options({**raw, key: "1"}, mode)
    assert str(caught.value) == f"Unknown option {key!r}. {message}"


def test_every_kafka_name_maps_to_an_option_that_exists_and_is_never_fuzzy_matched():
    names = {option.name for option in OPTIONS}
    for kafka in KAFKA_OPTIONS:
        assert kafka.ours is None or kafka.ours in names, kafka
        assert f"`{kafka.name}`" in kafka.sentence and (kafka.ours is None or f"`{kafka.ours}`" in kafka.sentence)
        if kafka.name in names:  # a name both take is parsed as ours: its sentence is for the docs only
            assert kafka.ours == kafka.name, kafka
            continue
        for mode in (STREAM, BATCH, WRITE):
            with pytest.raises(OptionError) as caught:
                parse_options({"stream": "S", kafka.name: "1"} if mode != WRITE else {kafka.name: "1"}, mode)
            assert "Did you mean" not in str(caught.value) and "Kafka's" in str(caught.value), (kafka, mode)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"connectTimeout": "soon"},
            "Option 'connectTimeout' has an invalid value 'soon': expected a duration",
        ),
        ({"connectTimeout": "0"}, "must be at least 0.1"),
        ({"servers": ""}, "name at least one server"),
        ({"servers": "http://x:80"}, "is malformed: expected a server URL such as nats://host:4222"),
        ({"servers": "nats://x:port"}, "malformed port"),
        ({"servers": "nats//127.0.0.1:p"}, "'nats//127.0.0.1:p' is malformed: expected a server URL such as nats://"),
        ({"servers": "nats://h:4222/path"}, "is malformed"),
        ({"servers": "tls://bad host:4222"}, "is malformed"),
        ({"user": "  "}, "must not be empty"),
    ],
)
def test_malformed_values_name_the_option(raw, message):
    with pytest.raises(OptionError, match=message):
        parse_connection_options(raw)


def test_secrets_never_show():
    with pytest.raises(OptionError) as caught:
        parse_options({"token": ""}, CONNECTION_OPTIONS)
    assert "<hidden>" in str(caught.value)
    options = ConnectionOptions(token="t0ken-XYZ", user="bob", password="pa55-XYZ")
    assert "t0ken-XYZ" not in repr(options) and "pa55-XYZ" not in repr(options)
    assert options.describe_auth() == "token, user/password"


@pytest.mark.parametrize(
    ("path", "text"), [("creds", "credsSecret"), ("nkey", "nkeySecret"), ("tls.key", "tls.keySecret")]
)
def test_a_secret_as_text_or_a_path_not_both(path, text):
    values = parse_options({text: "SU-seed-Or-pem-9"}, CONNECTION_OPTIONS)
    options = ConnectionOptions(**{option.attr: values[option.name] for option in CONNECTION_OPTIONS})
    assert "SU-seed-Or-pem-9" not in repr(options) and options.secrets == ("SU-seed-Or-pem-9",)
    with pytest.raises(OptionError, match=rf"^Set {re.escape(path)} or {re.escape(text)}, not both\.$"):
        parse_options({path: "/k", text.lower(): "x"}, CONNECTION_OPTIONS)
    with pytest.raises(OptionError, match=rf"^Option '{re.escape(text)}' has an invalid value <hidden>"):
        parse_options({text: ""}, CONNECTION_OPTIONS)


def test_an_imported_api_prefix_replaces_the_domain():
    assert parse_connection_options({"apiPrefix": " JS.OWNER.API.> "}).api_prefix == "JS.OWNER.API"
    assert parse_connection_options({"apiprefix": "JS.OWNER.API"}).api_prefix == "JS.OWNER.API"
    with pytest.raises(OptionError, match=r"^Set domain or apiPrefix, not both\."):
        parse_connection_options({"domain": "hub", "apiPrefix": "JS.OWNER.API"})
    with pytest.raises(
        OptionError, match=r"^Option 'apiPrefix' has an invalid value 'JS.\*.API': expected the subject"
    ):
        parse_connection_options({"apiPrefix": "JS.*.API"})


def test_pull_settings_keep_heartbeat_under_half_the_expiry():
    values = parse_options({"pullExpires": "2s", "pullBatchSize": "1_000"}, PULL_OPTIONS)
    settings = PullSettings.from_options(values)
    assert settings.batch == 1000
    assert settings.idle_heartbeat == 1.0
    short = PullSettings.from_options(parse_options({"pullExpires": "1s"}, PULL_OPTIONS))
    assert short.idle_heartbeat == 0.5  # the default drops to half of a short expiry
    # An explicit heartbeat over half the expiry is refused, not silently lowered.
    with pytest.raises(
        OptionError, match=r"'pullIdleHeartbeat' has an invalid value: 5s is more than half of pullExpires \(2s\)"
    ):
        parse_options({"pullExpires": "2s", "pullIdleHeartbeat": "5s"}, PULL_OPTIONS)
    # Under a short priorityTimeout the default expiry drops to a quarter of it, an explicit one is refused.
    short_pin = PullSettings.from_options(parse_options({"priorityTimeout": "8s"}, PULL_OPTIONS))
    assert (short_pin.expires, short_pin.idle_heartbeat) == (2.0, 1.0)
    with pytest.raises(OptionError, match=r"'pullExpires' has an invalid value: 5s is not under half of priority"):
        parse_options({"priorityTimeout": "8s", "pullExpires": "5s"}, PULL_OPTIONS)
    with pytest.raises(OptionError, match="'pullsInFlight' has an invalid value '0': it must be at least 1"):
        parse_options({"pullsInFlight": "0"}, PULL_OPTIONS)


@pytest.mark.parametrize("option", READER_OPTIONS, ids=lambda o: o.name)
@pytest.mark.parametrize(
    "value", ["", "   ", "-1", "99999999999999999999999999", "1e999", "not a value", "\u00e9\u00e9"]
)
def test_every_option_refuses_or_accepts_hostile_values_cleanly(option, value):
    """Each value is either accepted as a sane typed value or refused with an OptionError naming the option."""
    raw = {"stream": "S", "group": "g", option.name: value}
    try:
        parsed = parse_options(raw, READER_OPTIONS)[option.name]
    except OptionError as exc:
        assert f"Option {option.name!r}" in str(exc)
        if option.secret:
            assert value.strip() == "" or value not in str(exc)
        return
    assert parsed is not None and parsed != ""
    if isinstance(parsed, int | float) and option.minimum is not None:
        assert parsed >= option.minimum


def test_a_password_in_a_server_url_is_never_shown():
    for servers in ("nats//alice:pw-URL-1@127.0.0.1:p", "nats://alice:pw-URL-1@h:port", "alice:pw-URL-1@h/x"):
        with pytest.raises(OptionError) as caught:
            parse_connection_options({"servers": servers})
        assert "pw-URL-1" not in str(caught.value) and "alice:***@" in str(caught.value)
    options = parse_connection_options({"servers": "nats://alice:pw-URL-1@h:4222,nats://tok-URL-2@h2"})
    assert repr(options).startswith("ConnectionOptions(servers=('nats://alice:***@h:4222', 'nats://***@h2:4222'), ")
    assert options.describe_auth() == "user/password in the servers URL, token in the servers URL"


@pytest.mark.parametrize("mode", [BATCH, STREAM, LOAD])
def test_read_mode_and_min_partitions_apply_to_both_reads(mode):
    raw = {"servers": "nats://127.0.0.1:1", "stream": "S", "group": "g"}
    assert (parse_options(raw, mode)["readMode"], parse_options(raw, mode)["minPartitions"]) == ("auto", None)
    values = parse_options({**raw, "readmode": " Pull ", "minpartitions": "8"}, mode)  # Spark lowercases keys
    assert (values["readMode"], values["minPartitions"]) == ("pull", 8)
    with pytest.raises(OptionError, match="'readMode' has an invalid value 'kafka': expected auto, direct or pull"):
        parse_options({**raw, "readMode": "kafka"}, mode)
    with pytest.raises(OptionError, match="Option 'minPartitions' has an invalid value '0': expected a whole number"):
        parse_options({**raw, "minPartitions": "0"}, mode)


def test_batch_reads_take_the_pull_options_of_their_consumer_path():
    from spark_jetstream.read.batch import BatchConfig

    config = BatchConfig.parse({"stream": "S", "readMode": "pull", "pullBatchSize": "200", "pullMaxBytes": "1m"})
    assert (config.read_mode, config.batch, config.max_bytes) == ("pull", 200, 1 << 20)
    with pytest.raises(OptionError, match="Option 'pullsInFlight' applies to spark.readStream only"):
        BatchConfig.parse({"stream": "S", "pullsInFlight": "2"})


def test_options_spark_sets_on_a_writer_are_not_the_users():
    """PySpark 4.0-4.3 pass ``checkpointlocation`` and ``queryname`` to a streaming writer (a declarative pipeline's
    sink too); a user's typo beside them is still refused."""
    raw = {"servers": "nats://127.0.0.1:1", "checkpointlocation": "/cp", "queryname": "q"}
    assert parse_options(raw, WRITE)["servers"] == ("nats://127.0.0.1:1",)
    with pytest.raises(OptionError, match=r"^Unknown option 'subjct'\. Did you mean 'subject'\? Valid options: "):
        parse_options({**raw, "subjct": "x"}, WRITE)


@pytest.mark.parametrize(
    ("mode", "fix"),
    [
        (WRITE, "name the stream's subject with .option('subject', ...)"),
        (BATCH, "name the stream with"),
        (LOAD, "name"),
    ],
)
def test_a_path_given_to_load_or_save_is_refused_saying_what_to_set(mode, fix):
    with pytest.raises(
        OptionError, match=r"^The jetstream format takes no path \('ORDERS', given to load\(\) or save\(\)\): "
    ) as caught:
        parse_options({"stream": "S", "path": "ORDERS"}, mode)
    assert fix in str(caught.value)


@pytest.mark.parametrize("mode", [BATCH, LOAD])
def test_starting_at_the_group_needs_a_group(mode):
    raw = {"servers": "nats://127.0.0.1:1", "stream": "S", "startingPosition": "group"}
    with pytest.raises(OptionError, match=r"^startingPosition=group needs the group option: whose ack floor"):
        parse_options(raw, mode)
    assert parse_options({**raw, "group": "g"}, mode)["startingPosition"] == "group"


@pytest.mark.parametrize(
    ("streaming", "raw", "message"),
    [
        (
            False,
            {"startingPosition": "100", "endingPosition": "99"},
            "endingPosition (99) is before startingPosition (100): a batch read covers the stream sequences from "
            "startingPosition up to and including endingPosition.",
        ),
        (
            False,
            {"startingTimestamp": "2026-03-02T00:00:00Z", "endingTimestamp": "2026-03-01T00:00:00Z"},
            "endingTimestamp (2026-03-01T00:00:00+00:00) is not after startingTimestamp (2026-03-02T00:00:00+00:00): "
            "a batch read covers the messages stored at or after startingTimestamp and before endingTimestamp.",
        ),
        (
            True,
            {"servers": "nats//127.0.0.1:p"},
            "Option 'servers' has an invalid value 'nats//127.0.0.1:p': 'nats//127.0.0.1:p' is malformed: expected "
            "a server URL such as nats://host:4222.",
        ),
        (
            True,
            {"pullExpires": "60s"},
            "Option 'pullExpires' has an invalid value: 60s is not under half of priorityTimeout (120s), the member "
            "consumers' priority_timeout, so the pin would lapse between pulls: use at most 59s, or raise "
            "priorityTimeout.",
        ),
    ],
    ids=["seq-range", "time-range", "url-syntax", "pull-expires"],
)
def test_inconsistent_options_fail_at_load(spark, streaming, raw, message):
    """Refused by ``load()`` itself, before any connection (no server listens at the default URL's port)."""
    reader = spark.readStream if streaming else spark.read
    options = {"servers": "nats://127.0.0.1:1", "stream": "S", "group": "g", **raw}
    with pytest.raises(Exception) as caught:
        reader.format("jetstream").options(**options).load()
    text = caught.value.getMessage() if hasattr(caught.value, "getMessage") else str(caught.value)
    assert f"OptionError: {message}" in text


def test_the_option_reference_gives_each_option_its_type_modes_and_kafka_name():
    """One row per option, in its part, with the parser's type (and bounds), the modes and Kafka's equivalent."""
    from spark_jetstream.options import options_markdown

    text = options_markdown()
    rows = {line.split(" | ")[0].removeprefix("| `").removesuffix("`"): line for line in text.splitlines()}
    assert {option.name for option in OPTIONS} <= set(rows)
    assert rows["maxMessagesPerTrigger"].startswith(
        "| `maxMessagesPerTrigger` | integer ≥ 1 | - | `readStream` | `maxOffsetsPerTrigger` |"
    )
    assert rows["pullExpires"].startswith("| `pullExpires` | duration ≥ 0.1s | 5s | `readStream` | - |")
    assert rows["recordBatchBytes"].startswith("| `recordBatchBytes` | size, 1k to 1g | 16m | `readStream`, `read` |")
    assert rows["startingPosition"].split(" | ")[4] == "`startingOffsets`"
    assert (
        "- **size**: bytes, or `512k`, `64m` (64 MiB), `1g`: in a size `2m` is 2 MiB, in a duration two minutes" in text
    )
    parts = re.findall(r"^## (.+)$", text, re.M)
    assert parts == ["Connection", "Reading", "Consumer groups", "Writing", "Spark's Kafka options"]
