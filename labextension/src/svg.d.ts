/** SVG files import as their markup (the builder's webpack config does it). */
declare module '*.svg' {
  const markup: string;
  export default markup;
}
