"""The chat app's widgets, one per module: a chat message, the conversation's log of them, the
engine panel, the list of saved chats and the model chooser. A module's `STYLESHEET` is the
.tcss beside it, which the screens that show its widget load."""
from .chat_message import ChatMessage
from .conversation_list import ConversationList
from .engine_panel import EnginePanel
from .message_log import MessageLog
from .model_chooser import ModelChooser

__all__ = ["ChatMessage", "ConversationList", "EnginePanel", "MessageLog", "ModelChooser"]
