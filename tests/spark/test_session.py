"""The session builder: settings from sluice.toml and SLUICE_SPARK_*, loopback, quiet logs."""

from __future__ import annotations

import os
import re
import sys

import pytest

from pipeline.spark.session import LOG4J2_PROPERTIES, SparkSettings, spark_conf, spark_session


def test_defaults_are_local_on_loopback():
    settings = SparkSettings.from_config({}, environ={})
    assert (settings.master, settings.driver_host, settings.ui) == ("local[*]", "127.0.0.1", False)
    conf = spark_conf(settings)
    assert conf["spark.driver.bindAddress"] == conf["spark.driver.host"] == "127.0.0.1"
    assert conf["spark.pyspark.python"] == sys.executable
    assert conf["spark.ui.showConsoleProgress"] == "false"
    assert str(LOG4J2_PROPERTIES) in conf["spark.driver.extraJavaOptions"]


def test_environment_overrides_the_config_file():
    config = {"spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "3"}}}
    environ = {"SLUICE_SPARK_MASTER": "spark://127.0.0.1:7077", "SLUICE_SPARK_UI": "true"}
    settings = SparkSettings.from_config(config, environ=environ)
    assert settings.master == "spark://127.0.0.1:7077" and settings.ui
    assert spark_conf(settings)["spark.sql.shuffle.partitions"] == "3"
    assert SparkSettings.from_config(config, environ={}).master == "local[2]"


def test_a_misspelt_key_is_refused_naming_it_the_file_and_the_keys(tmp_path, monkeypatch):
    from pipeline.config import load_config
    from pipeline.settings import SettingsError

    path = tmp_path / "sluice.toml"
    path.write_text('[spark]\nmastr = "spark://cluster:7077"\n')
    monkeypatch.setenv("SLUICE_CONFIG", str(path))
    expected = (
        f"{path}: unknown key spark.mastr (did you mean spark.master? the keys of [spark] are "
        "master, app_name, driver_host, log_level, ui, conf, remote, class_archive, "
        "server_max_daemons)"
    )
    with pytest.raises(SettingsError, match=re.escape(expected)):
        SparkSettings.from_config(load_config(), environ={})
    elsewhere = tmp_path / "other.toml"
    with pytest.raises(
        SettingsError, match=re.escape(f"{elsewhere}: unknown key spark.colour (the")
    ):
        SparkSettings.from_config({"spark": {"colour": "red"}}, environ={}, source=elsewhere)
    with pytest.raises(SettingsError, match=re.escape("spark.conf is a table")):
        SparkSettings.from_config({"spark": {"conf": "spark.executor.memory=2g"}}, environ={})


def test_java_options_add_to_the_quiet_log_configuration():
    settings = SparkSettings(conf=(("spark.driver.extraJavaOptions", "-Xss4m"),))
    options = spark_conf(settings)["spark.driver.extraJavaOptions"]
    assert options.endswith(" -Xss4m") and "log4j2.configurationFile" in options


@pytest.mark.spark
def test_one_session_per_process_with_the_sources_registered(spark, store, store_dir):
    assert spark_session(SparkSettings(master="local[1]")) is spark  # the first settings win
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    assert spark.conf.get("spark.driver.host") == "127.0.0.1"
    assert spark.sparkContext.master == "local[2]"
    df = spark.read.format("sluice").option("stream", "a/b")
    with pytest.raises(Exception, match="stream a/b does not exist"):
        df.option("store", f"embedded:{store_dir}").load().collect()


@pytest.mark.spark
@pytest.mark.parametrize("how", ["batch", "stream"])
def test_a_source_read_from_no_store_leaves_none_behind(spark, tmp_path, how):
    """A misspelt `store` option (or none, and no store at the default) is a clear error, not
    a new empty store in which the stream then does not exist."""
    missing = tmp_path / "no-such-store"
    reader = spark.read if how == "batch" else spark.readStream
    df = reader.format("sluice").option("store", f"embedded:{missing}").option("stream", "a/b")
    expected = f"option store ('embedded:{missing}'): no store at {missing}: nothing was ever"
    with pytest.raises(Exception, match=re.escape(expected)):
        if how == "batch":
            df.load().collect()
        else:
            df.load().writeStream.format("noop").trigger(
                availableNow=True
            ).start().awaitTermination()
    assert not missing.exists()
