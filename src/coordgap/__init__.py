"""coordgap: measure, train and analyse LLM coordination on the dining-philosophers problem."""
