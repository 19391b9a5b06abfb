"""AWS Bedrock AgentCore Code Interpreter sessions as sandboxes (extra: agentcore)."""

from tasks.sandbox.providers.agentcore.provider import AgentCoreProvider

__all__ = ["AgentCoreProvider"]
