"""An identity's optional settings (human, mirror directory, mirror size) and its notification views:
the unread mirror and the system channel.
"""

from __future__ import annotations

import os

from agent_mail import errors, model
from agent_mail.parts import inputs, notifications
from agent_mail.operations.results import no_emit

TYPE_CHECKING = False
if TYPE_CHECKING:
    from agent_mail.operations.results import Emit


class Profiles:
    """The profile and notification operations of one mailbox (Mailbox.profile and .notifications call these)."""

    def __init__(self, mailbox):  # the agent_mail.operations.mail.Mailbox whose operations these are
        self.mailbox = mailbox
        self.store = mailbox.store
        self.mirrors = mailbox.mirrors

    def profile(self, *, agent: str, human: bool = False, mirror_dir: str | None = None,
                max_entries: int | None = None, clear=(), emit: Emit = no_emit) -> dict:
        """Show, or change, `agent`'s optional settings."""
        values = {"human": human, "mirror_dir": mirror_dir, "max_entries": max_entries, "clear": list(clear)}
        problems = inputs.profile_problems(values)
        if problems:
            raise errors.InvalidInput(problems)
        changing = human or mirror_dir is not None or max_entries is not None or bool(clear)
        with self.mirrors.changing(write=changing):
            current = self.store.profile(agent) or {"agent": agent, "human": False, "mirror_dir": None,
                                                     "max_entries": None, "updated_at": None}
            mirrors = []
            if changing:
                updated = dict(current)
                if human:
                    updated["human"] = True
                if mirror_dir is not None:
                    updated["mirror_dir"] = os.path.realpath(os.path.expanduser(mirror_dir))
                if max_entries is not None:
                    updated["max_entries"] = max_entries
                for name in clear:
                    updated[name.replace("-", "_")] = False if name == "human" else None
                updated["updated_at"] = model.now_iso()
                self.store.save_profile(updated)
                old_dir = current["mirror_dir"]
                if old_dir and old_dir != updated["mirror_dir"]:
                    for name in (notifications.EMAIL_FILE, notifications.SYSTEM_FILE):
                        mirrors.append({"agent": agent, **self.mirrors.write(old_dir, name, None)})
                mirrors += self.mirrors.render([agent], system=True)
                current = updated
            result = {**{k: current[k] for k in ("agent", "human", "mirror_dir", "max_entries", "updated_at")},
                      "mirrors": mirrors,
                      "mirror_problem": (notifications.mirror_problem(current["mirror_dir"]) if current["mirror_dir"]
                                         else None)}
            emit(result)
        return result

    def notifications(self, *, agent: str, dismiss=(), clear_email: bool = False, follow: bool = False,
                      emit: Emit = no_emit) -> dict:
        """The unread mirror and the system channel of `agent`; optionally dismiss events or clear the file,
        or (follow) keep its mirror current until stopped."""
        if follow:
            if dismiss or clear_email:
                raise errors.InvalidInput([("follow", f"runs until stopped; give {errors.arg('dismiss')} and "
                                                        f"{errors.arg('clear_email')} in a call of their own.")])
            return self.mailbox.waits.follow(agent, emit)
        wanted = list(dict.fromkeys(dismiss))
        with self.mirrors.changing(write=bool(wanted)):
            dismissed = []
            if wanted:
                at = model.now_iso()
                self.store.note_active(agent, self.mailbox.host, at)
                dismissed = self.store.dismiss_events(agent, wanted, at)
                unknown = [i for i in wanted if i not in dismissed]
                if unknown:
                    raise errors.NotFound([("dismiss", f"{i} is not an open event of {agent}; nothing was "
                                                         "dismissed.") for i in unknown])
                self.mirrors.render([agent], email=False, system=True)
            profile = self.store.profile(agent)
            cleared = False
            if clear_email and profile and profile["mirror_dir"]:
                written = self.mirrors.write(profile["mirror_dir"], notifications.EMAIL_FILE, None)
                cleared = written["status"] == "removed"
            result = {
                "agent": agent,
                "email": self.mirrors.unread_mirror(agent, profile),
                "system": notifications.system_channel(self.store.events(agent)),
                "dismissed": dismissed,
                "cleared": cleared,
            }
            emit(result)
        return result

