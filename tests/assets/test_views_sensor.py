"""The analytics views' sensor: an input materialized after the views' latest refresh started
gets a refresh, once; views refreshed after their inputs get none. The case it exists for:
a refresh that ends between two ticks of the automation sensor in which an input also
changed, which `AutomationCondition.eager()` counts as handled."""

from __future__ import annotations

import dagster as dg

from assets.sensors import evaluate_views, views_behind

UP, VIEWS = dg.AssetKey("up"), dg.AssetKey("views")


@dg.asset(key=UP)
def up() -> None:
    return None


@dg.asset(key=VIEWS, deps=[UP], automation_condition=dg.AutomationCondition.eager())
def views() -> None:
    return None


REFRESH = dg.define_asset_job("refresh", selection=dg.AssetSelection.assets(VIEWS))


def decide(instance: dg.DagsterInstance) -> dg.SensorResult:
    context = dg.build_sensor_context(instance=instance)
    return evaluate_views(context, VIEWS, [UP], "refresh")


def test_an_input_newer_than_the_refresh_gets_one_and_only_one():
    with dg.instance_for_test() as instance:
        assert views_behind(instance, VIEWS, [UP]) is None  # nothing materialized yet
        dg.materialize([up], instance=instance)
        dg.materialize([views], instance=instance)
        assert views_behind(instance, VIEWS, [UP]) is None
        assert decide(instance).run_requests == []

        dg.materialize([up], instance=instance)  # the input moves on after the refresh
        newest = views_behind(instance, VIEWS, [UP])
        assert newest is not None
        (request,) = decide(instance).run_requests
        assert request.run_key == f"refresh:{newest}" and request.job_name == "refresh"
        assert decide(instance).run_requests[0].run_key == request.run_key  # deduplicated

        dg.materialize([views], instance=instance)
        assert decide(instance).run_requests == []


def test_the_race_eager_misses_is_refreshed():
    """The views' refresh ends and an input updates between two ticks: eager() requests
    nothing at the next tick (both its trigger and its reset fire), the sensor does."""
    with dg.instance_for_test() as instance:

        def tick(cursor=None):
            return dg.evaluate_automation_conditions([up, views], instance, cursor=cursor)

        result = tick()
        dg.materialize([up], instance=instance)
        result = tick(result.cursor)
        assert result.total_requested == 1  # the views, for the input's first update
        dg.materialize([views], instance=instance)  # that refresh
        dg.materialize([up], instance=instance)  # an update after it started, same window
        result = tick(result.cursor)
        assert result.total_requested == 0  # eager() lets it go
        assert len(decide(instance).run_requests) == 1  # the sensor does not


def test_no_second_refresh_while_one_is_under_way():
    """A run of the refresh job carries no asset selection (its job selects the views alone):
    the sensor once took it for none under way, and launched a second refresh beside it."""
    with dg.instance_for_test() as instance:  # (resolving a job reads the current instance)
        defs = dg.Definitions(assets=[up, views], jobs=[REFRESH])
        refresh_job = defs.resolve_job_def("refresh")
        dg.materialize([up], instance=instance)
        assert len(decide(instance).run_requests) == 1
        for status in (dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTED):
            run = instance.create_run_for_job(refresh_job, status=status)
            assert run.asset_selection is None  # what the sensor used to look at, alone
            result = decide(instance)
            assert result.run_requests == []
            assert result.skip_reason.skip_message == "a refresh of the views is under way"
            instance.report_run_canceled(run)
        assert len(decide(instance).run_requests) == 1  # once it is over, the refresh is due

        picked = instance.create_run_for_job(  # a materialization picked in the UI, eager()
            defs.resolve_implicit_global_asset_job_def(),
            asset_selection=frozenset({VIEWS}),
            status=dg.DagsterRunStatus.NOT_STARTED,
        )
        assert decide(instance).run_requests == []
        instance.report_run_canceled(picked)
