"""The broker setting and the Celery configuration per transport: a plain Redis (the fleet's own unless broker_url
names another) or RabbitMQ, each with its own options, the same delivery semantics on both."""

from __future__ import annotations

import time

import fakeredis
import pytest
from pydantic import ValidationError

from scheduler.store import SchedulerStore
from shared.celery_config import (
    BROKER_HEARTBEAT_S,
    RUN_BATCH_TASK,
    TRANSPORTS,
    AmqpTransport,
    RedisTransport,
    broker_transport,
    make_celery,
    publish_options,
    queues_in_fleet_redis,
)
from shared.settings import Settings
from tests.unit.test_executor import scheduled_batch

REDIS = "redis://127.0.0.1:6390/0"
RABBITMQ = "amqp://guest:guest@127.0.0.1:5672//"


def test_the_broker_is_the_fleets_redis_unless_broker_url_names_another() -> None:
    assert Settings(redis_url=REDIS).celery_broker_url == REDIS
    assert Settings(redis_url=REDIS, broker_url=RABBITMQ).celery_broker_url == RABBITMQ
    assert Settings(redis_url=REDIS, broker_url="redis://broker:6379/3").celery_broker_url == "redis://broker:6379/3"


def test_a_redis_cluster_needs_its_own_broker_and_the_error_names_broker_url() -> None:
    with pytest.raises(ValidationError, match="broker_url must be set when redis_cluster is on"):
        Settings(redis_url=REDIS, redis_cluster=True)
    assert Settings(redis_url=REDIS, redis_cluster=True, broker_url=RABBITMQ).celery_broker_url == RABBITMQ


def test_the_transport_follows_the_urls_scheme_and_refuses_others_naming_broker_url() -> None:
    assert isinstance(broker_transport(Settings(redis_url=REDIS)), RedisTransport)
    assert isinstance(broker_transport(Settings(redis_url="rediss://h:6380/0")), RedisTransport)
    for url in (RABBITMQ, "amqps://u:p@h:5671/vh", "pyamqp://h//"):
        assert isinstance(broker_transport(Settings(redis_url=REDIS, broker_url=url)), AmqpTransport)
    with pytest.raises(ValueError, match=r"broker_url: unsupported scheme 'sqs'.*amqp://"):
        make_celery(Settings(redis_url=REDIS, broker_url="sqs://queue"))
    assert set(TRANSPORTS) >= {"redis", "amqp"}


@pytest.mark.parametrize("broker", [REDIS, RABBITMQ])
def test_both_brokers_deliver_one_batch_at_a_time_late_acked_on_the_fleets_own_queue(broker: str) -> None:
    settings = Settings(redis_url=REDIS, broker_url=broker, key_prefix="blue", batch_time_limit_s=120)
    conf = make_celery(settings).conf
    assert conf.broker_url == broker
    assert (conf.task_acks_late, conf.task_reject_on_worker_lost) == (True, True)
    assert (conf.worker_prefetch_multiplier, conf.worker_concurrency) == (1, 1)
    assert conf.task_serializer == "json" and conf.accept_content == ["json"]
    assert conf.task_default_queue == "blue.batches" == conf.task_routes[RUN_BATCH_TASK]["queue"]
    assert (conf.task_time_limit, conf.task_soft_time_limit) == (120, 108)
    assert conf.broker_connection_max_retries is None and conf.broker_connection_timeout > 0
    assert conf.worker_cancel_long_running_tasks_on_connection_loss is False


def test_redis_has_socket_timeouts_and_a_visibility_timeout_above_the_hard_limit() -> None:
    settings = Settings(redis_url=REDIS, redis_socket_timeout_s=3, visibility_timeout_s=1000, batch_time_limit_s=900)
    options = make_celery(settings).conf.broker_transport_options
    assert options["visibility_timeout"] == 1000 > settings.batch_time_limit_s
    assert options["global_keyprefix"] == "fusefleet:"  # every kombu key after the fleet's prefix
    assert options["socket_timeout"] == 3 and options["socket_connect_timeout"] > 0 and options["socket_keepalive"]
    assert "confirm_publish" not in options
    assert publish_options(settings) == {}  # a Redis publish is bounded by its socket timeout
    assert broker_transport(settings).warnings(settings) == []


def test_rabbitmq_confirms_each_publish_within_a_bound_and_beats() -> None:
    settings = Settings(redis_url=REDIS, broker_url=RABBITMQ, redis_socket_timeout_s=3)
    conf = make_celery(settings).conf
    assert conf.broker_transport_options == {"confirm_publish": True, "read_timeout": 3, "write_timeout": 3}
    assert "visibility_timeout" not in conf.broker_transport_options  # Redis only
    assert conf.broker_heartbeat == BROKER_HEARTBEAT_S > 0
    assert publish_options(settings) == {"timeout": 3, "confirm_timeout": 3}


def test_rabbitmq_warns_of_batches_longer_than_its_consumer_timeout() -> None:
    short = Settings(redis_url=REDIS, broker_url=RABBITMQ, batch_time_limit_s=900)
    long = Settings(
        redis_url=REDIS,
        broker_url=RABBITMQ,
        batch_time_limit_s=2400,
        visibility_timeout_s=3600,
        result_orphan_grace_s=3600,
    )
    assert broker_transport(short).warnings(short) == []
    (warning,) = broker_transport(long).warnings(long)
    assert "batch_time_limit_s (2400)" in warning and "consumer_timeout" in warning
    redis_long = long.model_copy(update={"broker_url": None})
    assert broker_transport(redis_long).warnings(redis_long) == []


def test_the_reaper_reads_the_queues_in_the_fleets_redis_only_when_that_redis_is_the_broker() -> None:
    def unasked() -> list[str]:
        raise AssertionError("a fleet of one model has no worker queues: its live workers are not read")

    def workers() -> list[str]:
        return ["w1"]

    assert queues_in_fleet_redis(Settings(redis_url=REDIS, key_prefix="blue"), unasked) == ("blue:blue.batches",)
    same = Settings(redis_url=REDIS, broker_url=REDIS, key_prefix="blue")
    assert queues_in_fleet_redis(same, unasked) == ("blue:blue.batches",)
    several = Settings(redis_url=REDIS, key_prefix="blue", models="sd=demo:stable-diffusion,px=demo:pixart")
    expected = ("blue:blue.batches", "blue:blue.batches.px", "blue:blue.batches@w1")  # every model's, each worker's
    assert queues_in_fleet_redis(several, workers) == expected
    for other in ("redis://broker:6379/0", RABBITMQ):
        assert queues_in_fleet_redis(several.model_copy(update={"broker_url": other}), workers) == ()


@pytest.mark.parametrize("broker", ["redis://broker:6379/0", RABBITMQ])
def test_on_another_broker_an_unclaimed_batch_is_published_again_whatever_lies_in_the_fleets_redis(
    client: fakeredis.FakeRedis, broker: str
) -> None:
    settings = Settings(redis_url=REDIS, broker_url=broker, key_prefix="t", batch_claim_timeout_s=1.0, queue_name="q")
    scheduled_batch(client, settings, ["a"])
    reaper = SchedulerStore(client, settings)
    assert reaper.reap().republish == []  # just published
    # a message left in the fleet's Redis by the broker it had before: no worker takes it from there any more
    client.lpush("q", '{"headers": {"id": "B1", "task": "fusefleet.run_batch"}}')
    time.sleep(1.2)
    assert reaper.reap().republish == ["B1"]  # unclaimed past the claim timeout: published again on the broker
    assert reaper.reap().republish == []  # stamped: not again before another timeout
