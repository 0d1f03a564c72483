"""The tool definitions of the synthetic coding agent."""

from __future__ import annotations

from collections.abc import Sequence

from ..jsontypes import JSONObject

__all__ = ["agent_tools"]


def agent_tools() -> list[JSONObject]:
    """Eight tool definitions of a coding agent (about 1k tokens as JSON)."""

    def tool(
        name: str, description: str, properties: JSONObject, required: Sequence[str]
    ) -> JSONObject:
        return {
            "type": "function",
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(required),
                "additionalProperties": False,
            },
            "strict": False,
        }

    text = {"type": "string"}
    return [
        tool(
            "exec_command",
            "Run a shell command in the repository and return its combined "
            "stdout and stderr. Use it for builds, tests, git and inspection commands.",
            {
                "cmd": {"type": "string", "description": "The command line to run."},
                "workdir": {"type": "string", "description": "Directory to run in."},
                "timeout_ms": {"type": "integer", "minimum": 100, "maximum": 600000},
            },
            ["cmd"],
        ),
        tool(
            "read_file",
            "Read a file (or a range of its lines) from the repository.",
            {
                "path": {"type": "string", "description": "Path relative to the root."},
                "start_line": {"type": "integer", "minimum": 1},
                "end_line": {"type": "integer", "minimum": 1},
            },
            ["path"],
        ),
        tool(
            "apply_patch",
            "Apply a unified diff to the repository. The patch must apply "
            "cleanly; on failure nothing is changed and the conflicts are reported.",
            {
                "patch": {"type": "string", "description": "The unified diff."},
                "reason": {"type": "string", "description": "Why the change is needed."},
            },
            ["patch"],
        ),
        tool(
            "list_dir",
            "List the entries of a directory with sizes and types.",
            {"path": text, "depth": {"type": "integer", "minimum": 1, "maximum": 5}},
            ["path"],
        ),
        tool(
            "grep_search",
            "Search the repository for a regular expression and return the "
            "matching lines with file names and line numbers.",
            {
                "pattern": {"type": "string", "description": "A ripgrep regular expression."},
                "path": text,
                "max_results": {"type": "integer", "minimum": 1, "maximum": 1000},
            },
            ["pattern"],
        ),
        tool(
            "run_tests",
            "Run the project's test suite, or a subset selected by expression, "
            "and return the report.",
            {
                "selector": {"type": "string", "description": "A pytest -k expression."},
                "verbose": {"type": "boolean"},
            },
            [],
        ),
        tool(
            "write_file",
            "Create or overwrite a file with the given content.",
            {"path": text, "content": {"type": "string", "description": "The new content."}},
            ["path", "content"],
        ),
        tool(
            "update_plan",
            "Record the plan: the steps and which of them are done. Keep it "
            "short and current; the user sees it.",
            {
                "explanation": {"type": "string", "description": "What changed and why."},
                "steps": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "step": text,
                            "status": {
                                "type": "string",
                                "enum": ["pending", "in_progress", "completed"],
                            },
                        },
                        "required": ["step", "status"],
                    },
                },
            },
            ["steps"],
        ),
    ]
