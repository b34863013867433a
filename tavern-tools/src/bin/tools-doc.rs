//! Prints the tool reference (`docs/TOOLS.md`) generated from the tool contracts.

use tavern_tools::{docs, tools, ToolLimits};

fn main() {
    let limits = ToolLimits::default();
    print!("{}", docs::render(&tools::specs(&limits), &limits));
}
