"""Reading measured results: loading and schema migrations, tables, claims, learned rules, the index page."""
