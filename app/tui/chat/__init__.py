"""The chat screen (screen.py), its keys and their actions (actions.py), and the parts it wires
together: the engine's lifecycle (engine_session.py), the reply being written (reply.py) and
the chat's record in the database (record.py)."""
from .actions import CHAT_ACTIONS, NOT_IN_FOOTER
from .screen import ChatScreen

__all__ = ["CHAT_ACTIONS", "NOT_IN_FOOTER", "ChatScreen"]
