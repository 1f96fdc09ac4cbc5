"""The spec's registry: a command is loaded when first looked up, and the table saying where each is declared
holds what the modules declare, in the manual's order."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agent_mail import spec
from tests.lib.cli import process_env

pytestmark = pytest.mark.fast


def _fresh(code: str) -> object:
    """What `code` prints as JSON, run in an interpreter that has imported nothing of the package yet."""
    done = subprocess.run([sys.executable, "-S", "-c", code], env=process_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_each_command_is_declared_in_the_module_the_table_names_and_in_the_manuals_order():
    code = ("import json, sys\n"
            "from agent_mail.spec import base\n"
            "found = {}\n"
            "for module in ('mail', 'reserving', 'tools'):\n"
            "    before = list(base.DECLARED)\n"
            "    __import__('agent_mail.spec.' + module)\n"
            "    found.update((name, module) for name in base.DECLARED if name not in before)\n"
            "print(json.dumps(list(found.items())))\n")
    assert _fresh(code) == [list(pair) for pair in spec.DECLARED_IN.items()]


@pytest.mark.parametrize(("name", "module"), [("read", "mail"), ("hook", "tools"), ("reserve", "reserving")])
def test_looking_a_command_up_loads_its_own_module_only(name, module):
    code = ("import json, sys\n"
            "from agent_mail import spec\n"
            f"args = [a.name for a in spec.COMMANDS[{name!r}].args]\n"
            "print(json.dumps([args, sorted(m for m in sys.modules if m.startswith('agent_mail.spec'))]))\n")
    args, loaded = _fresh(code)
    assert args == [a.name for a in spec.COMMANDS[name].args]
    assert loaded == sorted(["agent_mail.spec", "agent_mail.spec.base", f"agent_mail.spec.{module}"])


def test_the_registry_answers_as_a_mapping_of_every_command_in_order():
    names = list(spec.DECLARED_IN)
    assert list(spec.COMMANDS) == names == list(spec.COMMANDS.keys()) and len(spec.COMMANDS) == len(names)
    assert [c.name for c in spec.COMMANDS.values()] == names == [n for n, _ in spec.COMMANDS.items()]
    assert "send" in spec.COMMANDS and "nope" not in spec.COMMANDS and spec.COMMANDS.get("nope") is None
    assert spec.COMMANDS.get("send") is spec.COMMANDS["send"]
    with pytest.raises(KeyError):
        spec.COMMANDS["nope"]
    with pytest.raises(AttributeError):
        spec.NOT_A_NAME  # noqa: B018
    assert spec.SEARCH_FIELDS and spec.EXPORT_FORMAT and spec.INVARIANTS and "0" in spec.EXIT_CODES
