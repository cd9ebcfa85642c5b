"""LangGraph philosopher and table graphs, and the concurrent, resumable episode runner."""
