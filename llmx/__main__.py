from llmx.cli import main

main()
