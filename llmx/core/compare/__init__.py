"""Comparisons as data (``llmx compare``): a plugin declares the comparison its paper makes (``ComparisonSpec``:
arms, seeds, the evaluation that scores every arm item by item, the cost axis the arms are matched on), and one
runner (``runner``) runs each arm and seed as a normal run folder, pairs the items, and gives the verdict."""
