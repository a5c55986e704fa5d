"""The app's dialogs, one per module, over whichever screen opened them; they share
dialogs.tcss."""
from .code_picker import CodePickerModal
from .confirm import ConfirmModal
from .edit import EditModal
from .error import ErrorModal
from .export import ExportModal
from .help import HelpScreen
from .settings import SettingsModal
from .switch_model import ModelsModal

__all__ = ["CodePickerModal", "ConfirmModal", "EditModal", "ErrorModal", "ExportModal",
           "HelpScreen", "ModelsModal", "SettingsModal"]
