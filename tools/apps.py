from django.apps import AppConfig


class ToolsConfig(AppConfig):
    name = "tools"

    def ready(self) -> None:
        from .builtin import BUILTIN_TOOLS
        from .registry import backend_tool_names, backend_tool_register

        for tool in BUILTIN_TOOLS:
            if tool.name not in backend_tool_names():  # ready() may run twice in a process
                backend_tool_register(tool)
